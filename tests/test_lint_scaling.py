"""Lint time and memory grow linearly with the file size, up to a size limit that is
met (1 MiB: ~8 CPU-s of dense training code, benchmarks/results/lint_scaling.md);
pathological texts within it lint like any other, and Ctrl-C ends a run at once.

The pathological texts are a quarter of the limit, their time bounds a quarter of the
full size's: linear, as measured (a 964 KB line 10.6 CPU-s, 227 KB 2.3; a million carriage
returns 5.6, 250,000 1.4), so a blow-up worse than linear still fails them, in a quarter
of the time."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from autoaccel.config import LintSettings
from autoaccel.fileio import MAX_SOURCE_BYTES
from autoaccel.lint.engine import lint_source
from autoaccel.lint.runner import Mode, Overrides, lint_file
from autoaccel.long_strings import LongConcatenatedString
from autoaccel.source import parse
from running import sigint_as_from_a_terminal

ROOT = Path(__file__).resolve().parent.parent
# ACC101 at its second line, column 10.
LOADER = """from torch.utils.data import DataLoader
loader = DataLoader(train_set, batch_size=64)
for x, y in loader:
    loss = criterion(model(x), y)
    loss.backward()
"""


def found(source: str) -> list[tuple[int, int, str]]:
    return [
        (d.line, d.column, d.code) for d in lint_source(source, LintSettings(select=("ACC101",)))
    ]


def test_a_file_over_the_size_limit_is_refused_with_its_size(tmp_path):
    path = tmp_path / "big.py"
    path.write_text("import torch\n" + "x = 1\n" * (MAX_SOURCE_BYTES // 6))
    result = lint_file(path, Overrides(), Mode.CHECK)
    assert result.error == "1:1: error: larger than 1 MiB (1 MiB); not read"
    assert result.diagnostics == []


def test_the_size_limit_can_be_raised_or_lowered(tmp_path):
    path = tmp_path / "train.py"
    path.write_text("import torch\n" + LOADER)
    refused = lint_file(path, Overrides(max_file_size=50), Mode.CHECK)
    assert refused.error is not None and refused.error.startswith("1:1: error: larger than")
    assert [
        d.code for d in lint_file(path, Overrides(max_file_size=2**30), Mode.CHECK).diagnostics
    ] == ["ACC101"]


def test_a_finding_after_many_carriage_returns_is_on_its_line():
    source = "import torch  #" + "\r" * 50_000 + LOADER
    assert found(source) == [(50_002, 10, "ACC101")]


def test_ten_thousand_joined_strings_lint_normally():
    source = "import torch\nx = (\n" + '"a"  # part\n' * 10_000 + ")\n" + LOADER
    assert found(source) == [(10_005, 10, "ACC101")]
    module = parse(source)
    assert module.code == source
    assert isinstance(module.body[1].body[0].value, LongConcatenatedString)  # type: ignore[attr-defined]


def test_a_long_concatenation_keeps_its_value_and_its_f_string_parts():
    joined = parse("x = " + "'ab' " * 200 + "\n").body[0].body[0].value  # type: ignore[attr-defined]
    formatted = parse("x = (" + "'a'\n" * 200 + "f'{y}')\n").body[0].body[0].value  # type: ignore[attr-defined]
    assert joined.evaluated_value == "ab" * 200
    assert formatted.evaluated_value is None


def test_a_short_concatenation_stays_libcst_s_own():
    source = "x = (" + '"a"\n' * 100 + ")\n"
    assert type(parse(source).body[0].body[0].value).__name__ == "ConcatenatedString"  # type: ignore[attr-defined]


def largest_training_script(path: Path) -> Path:
    """The fixtures joined until the file is just under the size limit."""
    text = "\n\n".join(p.read_text() for p in sorted((ROOT / "fixtures").glob("*.py")))
    text = "\n\n".join([text] * (2 + MAX_SOURCE_BYTES // len(text)))
    path.write_text(text[: text.rfind("\ndef ", 0, MAX_SOURCE_BYTES) + 1])
    return path


@pytest.mark.runs
def test_ctrl_c_ends_a_lint_of_the_largest_file_within_a_second(tmp_path):
    script = largest_training_script(tmp_path / "train.py")
    for delay in (0.8, 1.6, 3.0):  # importing, CPython's parse, LibCST's native parse
        run = subprocess.Popen(
            [sys.executable, "-m", "autoaccel", "lint", str(script)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            preexec_fn=sigint_as_from_a_terminal,
        )
        time.sleep(delay)
        interrupted = time.monotonic()
        run.send_signal(signal.SIGINT)
        code = run.wait(timeout=30)
        assert time.monotonic() - interrupted < 1.0, delay
        assert code in (-signal.SIGINT, 130), code


@pytest.mark.runs
def test_a_quarter_megabyte_line_lints_in_seconds(tmp_path):
    line = tmp_path / "line.py"
    line.write_text(
        "import torch\n"
        + "; ".join(f"a{i} = torch.zeros({i})" for i in range(8_500))
        + "\n"
        + LOADER
    )
    start = time.process_time()
    result = lint_file(line, Overrides(), Mode.CHECK)
    assert [(d.line, d.code) for d in result.diagnostics if d.code == "ACC101"] == [(4, "ACC101")]
    assert time.process_time() - start < 6


@pytest.mark.runs
def test_a_quarter_million_carriage_returns_lint_in_seconds():
    start = time.process_time()
    assert found("import torch  #" + "\r" * 250_000 + LOADER) == [(250_002, 10, "ACC101")]
    assert time.process_time() - start < 4
