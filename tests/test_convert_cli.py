"""`autoaccel convert` as a user runs it: preview, write, check, formats, safety."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from typer.testing import CliRunner

from autoaccel.cli import app
from autoaccel.convert import command
from autoaccel.convert.log import ConvertOptions
from autoaccel.convert.pipeline import ConversionError

SCRIPT = """\
import torch
from torch.utils.data import DataLoader

# keep this comment
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
loader = DataLoader(dataset, batch_size=32, shuffle=True)
for x, y in loader:
    x = x.to(device)
    loss = model(x).sum()
    loss.backward()
"""


@dataclass
class Result:
    returncode: int
    stdout: str
    stderr: str


def convert(*args: str, cwd: Path) -> Result:
    """`autoaccel convert ARGS` run in `cwd`, in this process: the command line is
    typer's either way, and a subprocess costs a second of imports a test."""
    previous = Path.cwd()
    os.chdir(cwd)
    try:
        run = CliRunner().invoke(
            app, ["convert", *args], env={"NO_COLOR": "1"}, catch_exceptions=False
        )
    finally:
        os.chdir(previous)
    return Result(run.exit_code, run.stdout, run.stderr)


def test_python_m_autoaccel_converts_as_the_console_script_does(script, tmp_path):
    # the one test that starts `python -m autoaccel convert` as a user would
    run = subprocess.run(
        [sys.executable, "-m", "autoaccel", "convert", str(script), "--amp", "off"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={**os.environ, "NO_COLOR": "1"},
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout == convert(str(script), "--amp", "off", cwd=tmp_path).stdout


@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "train.py"
    path.write_text(SCRIPT)
    return path


def test_preview_prints_diff_and_summary_and_writes_nothing(script, tmp_path):
    result = convert(str(script), "--amp", "off", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert f"--- {script}" in result.stdout
    assert "+    num_workers=min(8, os.cpu_count() or 1)," in result.stdout
    assert "line 6: ACC101" in result.stdout  # lines of the original file
    assert "line 8: ACC103" in result.stdout
    assert script.read_text() == SCRIPT


def test_write_rewrites_in_place_and_keeps_everything_else(script, tmp_path):
    result = convert(str(script), "--amp", "off", "--write", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    converted = script.read_text()
    assert "non_blocking=True" in converted
    assert "# keep this comment\n" in converted
    assert converted.startswith("import os\n\nimport torch\n")


@pytest.mark.parametrize("writing", [["--write"], ["-o", "fast.py"]])
def test_diff_never_writes_so_it_excludes_write_and_output(script, tmp_path, writing):
    result = convert(str(script), "--diff", *writing, cwd=tmp_path)
    assert result.returncode == 2
    assert "--diff writes nothing: use it without --write and -o" in result.stderr
    assert script.read_text() == SCRIPT
    assert not (tmp_path / "fast.py").exists()


def test_check_exits_1_when_the_script_would_change_and_0_after(script, tmp_path):
    assert convert(str(script), "--check", "--amp", "off", cwd=tmp_path).returncode == 1
    assert convert(str(script), "--write", "--amp", "off", cwd=tmp_path).returncode == 0
    assert convert(str(script), "--check", "--amp", "off", cwd=tmp_path).returncode == 0


def test_output_file_leaves_the_input_alone(script, tmp_path):
    out = tmp_path / "fast.py"
    assert convert(str(script), "-o", str(out), "--amp", "off", cwd=tmp_path).returncode == 0
    assert script.read_text() == SCRIPT
    assert "pin_memory=torch.cuda.is_available()" in out.read_text()


def test_crlf_newlines_and_permissions_are_kept(tmp_path):
    path = tmp_path / "train.py"
    path.write_bytes(SCRIPT.replace("\n", "\r\n").encode())
    path.chmod(0o750)
    assert convert(str(path), "--write", "--amp", "off", cwd=tmp_path).returncode == 0
    data = path.read_bytes()
    assert b"non_blocking=True" in data
    assert data.count(b"\n") == data.count(b"\r\n")
    assert stat.S_IMODE(path.stat().st_mode) == 0o750


def test_python2_file_is_an_error_with_location_and_stays_untouched(tmp_path):
    path = tmp_path / "old.py"
    source = "import torch\nx = torch.zeros(3)\ny = x.cuda(async=True)\n"
    path.write_text(source)
    result = convert(str(path), "--write", cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.startswith(f"{path}:3:")
    assert path.read_text() == source


def test_markdown_is_a_pr_comment_body(script, tmp_path):
    result = convert(str(script), "--format", "markdown", "--amp", "off", cwd=tmp_path)
    assert result.returncode == 0
    assert result.stdout.startswith(f"### autoaccel convert: `{script}`")
    assert "```diff\n" in result.stdout
    assert "- line 6: ACC101" in result.stdout


def test_json_lists_the_changes(script, tmp_path):
    result = convert(str(script), "--format", "json", "--amp", "off", cwd=tmp_path)
    report = json.loads(result.stdout)
    assert report["changed"] is True
    assert {change["code"] for change in report["changes"]} >= {"ACC101", "ACC102", "ACC103"}


def test_already_fast_script_reports_nothing_to_change(tmp_path):
    path = tmp_path / "plain.py"
    path.write_text("import torch\nprint(torch.ones(2))\n")
    result = convert(str(path), cwd=tmp_path)
    assert result.returncode == 0
    assert "nothing to change" in result.stdout


def test_bad_option_value_is_a_usage_error(script, tmp_path):
    result = convert(str(script), "--amp", "fp8", cwd=tmp_path)
    assert result.returncode == 2
    assert "--amp" in result.stderr


def test_workers_keep_leaves_num_workers_alone(script, tmp_path):
    run = convert("train.py", "--workers", "keep", cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert "num_workers" not in run.stdout
    assert "pin_memory=torch.cuda.is_available()" in run.stdout


def test_workers_policy_comes_from_pyproject(script, tmp_path):
    (tmp_path / "pyproject.toml").write_text('[tool.autoaccel.convert]\nworkers = "keep"\n')
    assert "num_workers" not in convert("train.py", cwd=tmp_path).stdout
    assert "num_workers" in convert("train.py", "--workers", "auto", cwd=tmp_path).stdout


def test_skipped_steps_are_reported_when_writing_with_no_change(tmp_path):
    path = tmp_path / "train.py"
    path.write_text(
        "import torch\n"
        "for x in loader:\n"
        "    for p in model.parameters(): p.data -= p.grad\n"
        "    loss = model(x).sum(); loss.backward()\n"
    )
    run = convert("train.py", "--write", cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert "not applied" in run.stdout


@pytest.mark.parametrize(
    "determinism",
    ["torch.backends.cudnn.deterministic = True", "torch.use_deterministic_algorithms(True)"],
)
def test_cudnn_benchmark_is_skipped_with_a_note_when_determinism_is_asked_for(determinism):
    from autoaccel.convert.log import ConvertOptions
    from autoaccel.convert.pipeline import convert_source

    source = (
        "import torch\nimport torch.nn as nn\n\n"
        f"{determinism}\n"
        "model = nn.Conv2d(3, 8, 3).cuda()\n"
        "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "for x in loader:\n"
        "    model(x.cuda()).sum().backward()\n"
    )
    result = convert_source(source, ConvertOptions(amp="off"))
    assert "cudnn.benchmark" not in result.converted
    (note,) = [s for s in result.log.skipped if s.what.startswith("ACC201")]
    assert note.line == 4
    assert "deterministic" in note.reason


def test_ddp_launch_commands_name_the_written_script(script, tmp_path):
    # `model` is never trained by an optimizer here: ddp refuses unless told to write
    run = convert(
        "train.py",
        "--to",
        "ddp",
        "--allow-partial",
        "-o",
        "train_ddp.py",
        "--no-verify",
        cwd=tmp_path,
    )
    assert run.returncode == 0, run.stderr
    assert "torchrun --standalone --nproc_per_node=2 train_ddp.py" in run.stdout


@pytest.mark.parametrize("report_format", ["text", "markdown"])
def test_a_refused_conversion_prints_no_launch_commands(script, tmp_path, report_format):
    # as above, without --allow-partial: refused, and there is no script to run
    run = convert("train.py", "--to", "ddp", "--write", "--format", report_format, cwd=tmp_path)
    assert run.returncode == 1 and "--to ddp refused" in run.stderr
    assert "Run it" not in run.stdout and "torchrun --standalone" not in run.stdout
    assert script.read_text() == SCRIPT


def test_a_refused_project_conversion_prints_no_launch_commands(tmp_path):
    # the loader is made inside the `for` of a module: it cannot get a sampler
    (tmp_path / "steps.py").write_text(
        "from torch.utils.data import DataLoader\n\n\n"
        "def train(model, optimizer, dataset):\n"
        "    for x, y in DataLoader(dataset, batch_size=8, shuffle=True):\n"
        "        loss = (model(x) - y).pow(2).mean()\n"
        "        optimizer.zero_grad()\n"
        "        loss.backward()\n"
        "        optimizer.step()\n"
    )
    (tmp_path / "train.py").write_text(
        "import torch\nfrom steps import train\n\nmodel = torch.nn.Linear(4, 1)\n"
        "train(model, torch.optim.SGD(model.parameters(), lr=0.1), dataset)\n"
    )
    run = convert("train.py", "--to", "ddp", "--write", cwd=tmp_path)
    assert run.returncode == 1 and "steps.py:5:1: error: DistributedSampler" in run.stderr
    assert "Run it" not in run.stdout and "torchrun --standalone" not in run.stdout


@pytest.mark.parametrize(
    "failure",
    [
        pytest.param(AttributeError("'NoneType' object has no attribute 'x'\nmore"), id="bug"),
        pytest.param(
            ConversionError("internal error: a step is not idempotent", details="--- first\n"),
            id="not-idempotent",
        ),
    ],
)
def test_internal_error_is_one_line_and_exit_2(script, monkeypatch, capsys, failure):
    def fail(*args, **kwargs):
        raise failure

    monkeypatch.setattr(command, "convert_source", fail)
    code = command.run_convert(script, ConvertOptions(), write=True)
    err = capsys.readouterr().err
    assert code == 2
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert err.startswith(f"{script}: internal error: ")
    log = Path(err.rstrip().rsplit("(details: ", 1)[1].rstrip(")"))
    assert log.read_text()  # the traceback or the diff, for a bug report
    log.unlink()
    assert script.read_text() == SCRIPT
