"""Habits users bring from Ruff, Black and pre-commit: `-` for stdin with
`--stdin-filename`, shell completion, readable `--help`, Ctrl-C, progress off a TTY."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import SCRIPT, SELECT
from typer.testing import CliRunner

from autoaccel.cli import app
from autoaccel.cli import convert as convert_command

from running import FIXTURES_DIR, sigint_as_from_a_terminal

CONVERTIBLE = """\
import torch
from torch.utils.data import DataLoader

loader = DataLoader(dataset, batch_size=32, shuffle=True)
for x, y in loader:
    loss = model(x.cuda()).sum()
    loss.backward()
"""


# -- `convert -` ----------------------------------------------------------------------------
def test_convert_dash_prints_the_converted_script_and_reports_on_stderr(cli):
    run = cli("convert", "-", "--amp", "off", input=CONVERTIBLE)
    assert run.exit_code == 0, run.stderr
    assert run.stdout.startswith("import os\n")
    assert "pin_memory=torch.cuda.is_available()" in run.stdout
    assert "x.cuda(non_blocking=True)" in run.stdout
    assert "--- -\n+++ -\n" in run.stderr and "-: 3 changes" in run.stderr


def test_convert_dash_of_a_fast_script_echoes_it(cli):
    fast = "import torch\n\nx = torch.ones(2)\n"
    run = cli("convert", "-", input=fast)
    assert (run.exit_code, run.stdout) == (0, fast)


def test_convert_dash_with_check_or_diff_prints_the_report_not_the_code(cli):
    check = cli("convert", "-", "--amp", "off", "--check", input=CONVERTIBLE)
    assert check.exit_code == 1
    assert check.stdout.startswith("--- -\n")
    diff = cli("convert", "-", "--amp", "off", "--diff", input=CONVERTIBLE)
    assert (diff.exit_code, diff.stdout) == (0, check.stdout)


def test_convert_dash_writes_nothing_and_reports_a_syntax_error(cli):
    run = cli("convert", "-", "--stdin-filename", "train.py", input="def (:\n")
    assert run.exit_code == 2
    assert run.stdout == ""
    assert run.stderr.startswith("train.py:1:")


def test_convert_stdin_filename_names_the_script_and_finds_its_config(cli, tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "pyproject.toml").write_text(
        '[tool.autoaccel.convert]\namp = "off"\nworkers = "keep"\n'
    )
    run = cli(
        "convert", "-", "--stdin-filename", "sub/train.py", "--format", "json", input=CONVERTIBLE
    )
    assert run.exit_code == 0, run.stderr
    assert '"path": "sub/train.py"' in run.stderr
    assert "num_workers" not in run.stdout  # workers = "keep" from sub/pyproject.toml
    assert "pin_memory=torch.cuda.is_available()" in run.stdout


def test_convert_stdin_filename_reads_the_projects_local_imports(cli, tmp_path, monkeypatch):
    shutil.copytree(FIXTURES_DIR / "packaged", tmp_path / "packaged")
    monkeypatch.chdir(tmp_path / "packaged")
    script = Path("train.py").read_text()
    preview = cli(
        "convert", "-", "--stdin-filename", "train.py", "--amp", "off", "--diff", input=script
    )
    assert "--- toygpt/data.py\n" in preview.stdout  # the loader lives in a module
    # stdout holds one script: a conversion that changes modules too is refused
    run = cli(
        "convert", "-", "--stdin-filename", "train.py", "--to", "ddp", "--amp", "off", input=script
    )
    assert (run.exit_code, run.stdout) == (2, "")
    assert "train.py: error: the conversion changes 3 files" in run.stderr
    assert "stdout takes the script only" in run.stderr


def test_convert_output_dash_prints_a_files_conversion(cli, tmp_path):
    (tmp_path / "train.py").write_text(CONVERTIBLE)
    run = cli("convert", "train.py", "--amp", "off", "-o", "-")
    assert run.exit_code == 0, run.stderr
    assert "pin_memory=torch.cuda.is_available()" in run.stdout and "--- train.py" in run.stderr
    assert (tmp_path / "train.py").read_text() == CONVERTIBLE


@pytest.mark.parametrize(
    "args",
    [["-", "--write"], ["-", "--verify", "--to", "ddp"], ["train.py", "--stdin-filename", "x.py"]],
    ids=["write", "verify", "stdin-filename-without-dash"],
)
def test_convert_dash_refuses_what_it_cannot_do(cli, args):
    run = cli("convert", *args, input=CONVERTIBLE)
    assert run.exit_code == 2
    assert run.stdout == ""


# -- `lint - --stdin-filename` --------------------------------------------------------------
def test_lint_stdin_filename_names_findings_and_applies_its_config(cli, tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "pyproject.toml").write_text('[tool.autoaccel]\nignore = ["ACC101"]\n')
    run = cli("lint", *SELECT, "-", "--stdin-filename", "sub/train.py", input=SCRIPT)
    assert run.exit_code == 1
    assert run.stdout.splitlines() == [
        "sub/train.py:4:10: ACC102 [*] `DataLoader` feeding CUDA does not pin memory (`pin_memory=False`)"
    ]


def test_lint_stdin_filename_with_force_exclude_skips_excluded_paths(cli):
    run = cli(
        "lint", "--fix", "--force-exclude", "-", "--stdin-filename", "tests/test_x.py", input=SCRIPT
    )
    assert (run.exit_code, run.stdout) == (0, SCRIPT)


def test_lint_stdin_filename_needs_dash(cli, tmp_path):
    (tmp_path / "train.py").write_text(SCRIPT)
    run = cli("lint", "train.py", "--stdin-filename", "x.py")
    assert run.exit_code == 2
    assert "--stdin-filename" in run.stderr


# -- the counts of `lint` and `lint --fix` ----------------------------------------------------
# `--fix` re-lints after each round and counts what it found in all. The copies in
# `evaluate` read the loader ACC102 pins: ACC103 reports them in the first round already
# (it once found them only after the pin was written, and the rounds differed).
STYLE_SCRIPT = (Path(__file__).resolve().parent / "styles" / "string_device_fn.py").read_text()


def test_lint_fix_counts_what_it_fixed_and_what_remains_as_found(cli, tmp_path):
    (tmp_path / "train.py").write_text(STYLE_SCRIPT)
    check = cli("lint", "--unsafe-fixes", "train.py")
    fixable = check.stdout.count(" [*] ")
    assert f"[*] {fixable} fixable with the `--fix` option." in check.stderr
    assert "non_blocking" in check.stdout
    run = cli("lint", "--unsafe-fixes", "--fix", "train.py")
    summary = re.fullmatch(r"Found (\d+) errors \((\d+) fixed, (\d+) remaining\)\.\n", run.stderr)
    assert summary, run.stderr
    found, fixed, remaining = map(int, summary.groups())
    assert fixed == fixable  # every finding a fix could make, in the first lint already
    assert (found, remaining) == (fixed + remaining, run.stdout.count("\n"))


# -- `--help` ---------------------------------------------------------------------------------
def help_text(*args: str, columns: int) -> str:
    run = CliRunner().invoke(app, [*args, "--help"], env={"COLUMNS": str(columns)})
    assert run.exit_code == 0, run.output
    return run.stdout


def joined(text: str) -> str:
    """`text` with the help's line breaks and indents undone."""
    return " ".join(text.split())


@pytest.mark.parametrize("columns", [200, 40])
@pytest.mark.parametrize("command", ["convert", "lint", "tune", "bench", "config", "rules"])
def test_help_names_values_by_metavars_not_python_types(command, columns):
    text = help_text(command, columns=columns)
    assert not re.search(r"<(list|str|path|int|float)", text), text


@pytest.mark.parametrize("columns", [200, 40])
def test_lint_help_metavars(columns):
    text = joined(help_text("lint", columns=columns))
    assert "--select CODES" in text and "--ignore CODES" in text
    assert "--stdin-filename PATH" in text and "PATHS Files or directories" in text


@pytest.mark.parametrize("columns", [200, 40])
def test_convert_help_shows_its_whole_description_and_metavars(columns):
    text = joined(help_text("convert", columns=columns))
    assert joined(convert_command.__doc__) in text
    assert "FILE The training script" in text and "-o, --output PATH" in text


@pytest.mark.parametrize("columns", [200, 40])
def test_command_list_shows_whole_descriptions(columns):
    text = joined(help_text(columns=columns))
    assert (
        "Rewrite a training script into a fast one (a diff preview unless --write or -o)." in text
    )
    assert "..." not in text.split("Commands:")[1]


# -- robustness --------------------------------------------------------------------------------
def children(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/task/{pid}/children").read_text().split()


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="reads /proc for the workers")
def test_lint_interrupted_in_a_parallel_run_exits_130_without_a_traceback(tmp_path):
    for number in range(100):  # ~5 s of work on two cores: Ctrl-C comes in the middle
        (tmp_path / f"train_{number}.py").write_text("\n\n".join([STYLE_SCRIPT] * 10))
    lint = subprocess.Popen(
        [sys.executable, "-m", "autoaccel", "lint", str(tmp_path)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=sigint_as_from_a_terminal,
    )
    deadline = time.monotonic() + 60
    while not children(lint.pid) and time.monotonic() < deadline:  # the pool has started
        time.sleep(0.1)
    time.sleep(0.5)
    lint.send_signal(signal.SIGINT)
    _, stderr = lint.communicate(timeout=120)
    assert (lint.returncode, stderr) == (130, "")


def test_lint_max_file_size(cli, tmp_path):
    (tmp_path / "train.py").write_text(SCRIPT)
    size = len(SCRIPT.encode())
    refused = cli("lint", *SELECT, "--max-file-size", str(size - 1), "train.py")
    assert refused.exit_code == 2
    assert "train.py:1:1: error: larger than" in refused.stderr
    assert cli("lint", *SELECT, "--max-file-size", "1KiB", "train.py").exit_code == 1
    stdin = cli("lint", *SELECT, "--max-file-size", str(size - 1), "-", input=SCRIPT)
    assert stdin.exit_code == 2 and "-:1:1: error: larger than" in stdin.stderr


@pytest.mark.parametrize("size", ["2x", "0", "-5", "1.5MiB"])
def test_lint_max_file_size_takes_whole_sizes_only(cli, size):
    run = cli("lint", "--max-file-size", size, "-", input=SCRIPT)
    assert run.exit_code == 2
    assert "--max-file-size" in run.stderr


# -- shell completion --------------------------------------------------------------------------
def autoaccel_with(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "autoaccel", *args],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
    )


def test_show_completion_prints_the_bash_script():
    """Typer takes the shell from the process tree (shellingham), not from the argument:
    run from a bash that stays the parent (`; exit $?` keeps bash from exec-ing the command),
    as a user's would be, not from a process whose shell has exited (a detached job)."""
    run = subprocess.run(
        ["bash", "-c", '"$0" -m autoaccel --show-completion bash; exit $?', sys.executable],
        capture_output=True,
        text=True,
        env={**os.environ, "SHELL": "/bin/bash"},
    )
    assert run.returncode == 0, run.stderr
    assert "complete -o default -F _autoaccel_completion autoaccel" in run.stdout


def test_completion_completes_commands_and_options():
    def complete(*words: str) -> list[str]:
        env = {
            "_AUTOACCEL_COMPLETE": "complete_bash",
            "COMP_WORDS": " ".join(["autoaccel", *words]),
            "COMP_CWORD": str(len(words)),
        }
        return autoaccel_with(env).stdout.split()

    assert complete("co") == ["convert", "config"]
    assert "--stdin-filename" in complete("lint", "--s")
