"""Every line a conversion report names is a line of the file the user has: the
original's line of the statement a change or a "not changed" item is about (lint's
line for a lint finding), `cell N:line` in a notebook."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest

import autoaccel.convert.pipeline as pipeline
from autoaccel.config import LintSettings
from autoaccel.convert.log import ConversionLog, ConvertOptions
from autoaccel.convert.pipeline import Conversion, convert_source
from autoaccel.convert.report import json_object, launch_report, markdown_report, text_report
from autoaccel.diff import original_line
from autoaccel.lint.engine import analyse
from autoaccel.notebook import Notebook
from test_notebooks import notebook_text

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "fixtures"
SINGLE = ConvertOptions()
DP = ConvertOptions(target="dp", amp="off")
DDP = ConvertOptions(target="ddp", amp="off")
FSDP = ConvertOptions(target="fsdp", amp="off")
# The options each folder's fixtures are converted with by the snapshot tests; the top
# folder's `--to dp` and `--to ddp` conversions (some 15 s) run with the `runs` tests.
CASES = [
    *((path, SINGLE) for path in sorted(FIXTURES.glob("*.py"))),
    *((path, DDP) for path in sorted((FIXTURES / "ddp").glob("*.py"))),
    *((path, FSDP) for path in sorted((FIXTURES / "fsdp").glob("*.py"))),
    *((path, DDP) for path in sorted((FIXTURES / "legacy_distributed").glob("*.py"))),
    *(
        pytest.param((path, options), marks=pytest.mark.runs)
        for path in sorted(FIXTURES.glob("*.py"))
        for options in (DP, DDP)
    ),
]
FINDING = re.compile(r"(ACC\d+) \(")  # a "not changed" item of a lint rule: `ACC203 (name)`


def _case_id(case: tuple[Path, ConvertOptions]) -> str:
    path, options = case
    return f"{path.relative_to(FIXTURES)}-{options.target}"


def _lint_lines(source: str, path: Path) -> set[tuple[str, int]]:
    """(code, line) of each finding and note of lint on `source`."""
    analysis = analyse(source, LintSettings(), script=path)
    return {(d.code, d.line) for d in analysis.diagnostics} | {
        (n.code, n.line) for n in analysis.notes
    }


def _converted_with_step_lines(
    source: str, options: ConvertOptions, path: Path, monkeypatch
) -> tuple[Conversion, dict[int, str]]:
    """`source` converted, and the text of each reported line as the step that logged it
    saw it: report line -> that text (lines the step made up are left out)."""
    seen: dict[int, str] = {}

    def recording(history: list[tuple[str, str]], line: int) -> int:
        mapped = original_line(history, line)
        step_lines = (history[-1][1] if history else source).splitlines()
        if line <= len(step_lines):
            seen.setdefault(mapped, step_lines[line - 1].strip())
        return mapped

    monkeypatch.setattr(pipeline, "original_line", recording)
    return convert_source(source, options, str(path)), seen


@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_report_lines_are_lines_of_the_original(case, monkeypatch):
    path, options = case
    source = path.read_text(encoding="utf-8")
    original = source.splitlines()
    conversion, step_lines = _converted_with_step_lines(source, options, path, monkeypatch)
    linted = _lint_lines(source, path)
    entries = [(c.code, c.line) for c in conversion.log.changes]
    entries += [(s.what, s.line) for s in conversion.log.skipped if s.line is not None]
    for what, line in entries:
        assert 1 <= line <= len(original), f"{what}: line {line} is not in the file"
        finding = FINDING.match(what)
        if finding:  # a lint finding left alone: where lint reports it
            assert (finding.group(1), line) in linted, f"{what}: lint does not report line {line}"
        seen = step_lines.get(line)
        if seen is not None and seen in (text.strip() for text in original):
            # the statement the step saw is a line of the original: that line
            assert original[line - 1].strip() == seen, f"{what}: line {line} is not {seen!r}"


ACCUMULATED_LOSS = """\
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, Dataset


class Squares(Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, index):
        return torch.full((1, 8, 8), float(index)), index % 2


device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
model = nn.Sequential(nn.Conv2d(1, 4, 3), nn.Flatten(), nn.Linear(144, 2)).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
loader = DataLoader(Squares(), batch_size=8, shuffle=True)

for epoch in range(2):
    total_loss = 0
    for images, labels in loader:
        images, labels = images.to(device), labels.to(device)
        loss = nn.functional.cross_entropy(model(images), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        total_loss += loss
    print(epoch, total_loss)
"""


def test_a_finding_left_below_inserted_lines_is_reported_at_lints_line():
    # The cudnn.benchmark set-up goes in above the loop; ACC203 (an unsafe fix) stays.
    conversion = convert_source(ACCUMULATED_LOSS, SINGLE, "train.py")
    report = text_report(conversion, "train.py", colour=False)
    assert "  line 27: ACC203 (loss-accumulated-with-graph) not applied" in report
    assert ACCUMULATED_LOSS.splitlines()[26].strip() == "total_loss += loss"


def test_fsdp_labels_its_changes_fsdp():
    source = (FIXTURES / "fsdp" / "conv_net.py").read_text(encoding="utf-8")
    conversion = convert_source(source, FSDP, "conv_net.py")
    codes = {change.code for change in conversion.log.changes}
    assert "ddp" not in codes
    report = text_report(conversion, "conv_net.py", colour=False)
    assert re.search(r"line \d+: fsdp process group from torchrun's environment", report)


def test_ddp_keeps_its_label():
    source = (FIXTURES / "fsdp" / "conv_net.py").read_text(encoding="utf-8")
    codes = {change.code for change in convert_source(source, DDP, "conv_net.py").log.changes}
    assert "ddp" in codes and "fsdp" not in codes


def test_a_companion_file_name_stays_in_its_comment():
    log = ConversionLog(launch=["python train.py"], extra_files={"job\nrm -rf ~.sbatch": ""})
    report = launch_report(Conversion("", "", log), markdown=False)
    assert report.splitlines()[1:] == [
        "  python train.py",
        "  # --write / -o also writes 'job?rm -rf ~.sbatch' beside the script",
    ]


# A markdown cell, then three code cells (cells 2-4), one with a magic.
NOTEBOOK = notebook_text(
    "import torch\nfrom torch.utils.data import DataLoader\n",
    "%matplotlib inline\nloader = DataLoader(torch.randn(512, 1024), batch_size=256)\n",
    textwrap.dedent("""\
        model = torch.nn.Linear(1024, 1024).cuda()  # wide enough for ACC301
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for x in loader:
            x = x.cuda()
            loss = model(x).pow(2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        """),
)


def test_a_notebook_report_names_cells_and_lines_as_lint_does():
    notebook = Notebook(NOTEBOOK)
    conversion = convert_source(notebook.python, SINGLE, "train.ipynb")
    linted = {
        (
            d.code,
            str(notebook.cell_range(d.line, d.column, d.end_line, d.end_column)).rsplit(":", 1)[0],
        )
        for d in analyse(notebook.python, LintSettings()).diagnostics
    }
    # the report of the notebook's cells as `autoaccel convert` shows them
    shown = Conversion(
        notebook.render(conversion.original), notebook.render(conversion.converted), conversion.log
    )
    report = text_report(shown, "train.ipynb", colour=False)
    named = set(re.findall(r"^  (cell \d+:\d+): (ACC\d+) ", report, re.MULTILINE))
    assert ("cell 4:4", "ACC103") in named  # `x = x.cuda()`
    assert named <= {(where, code) for code, where in linted}
    assert "line " not in markdown_report(shown, "train.ipynb").split("```")[0]
    rows = json_object(shown, "train.ipynb")["changes"]
    assert {"code": "ACC103", "cell": 4, "line": 4} in [
        {key: row[key] for key in ("code", "cell", "line")} for row in rows
    ]
