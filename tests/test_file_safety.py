"""Bad files and bad places to write: every case is `path: message`, exit 2, with the
other files still linted or fixed, and nothing lost (issue 19)."""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import SCRIPT, SELECT

from autoaccel import fileio
from autoaccel.lint import runner

FIXED = SCRIPT.replace("batch_size=32)", "batch_size=32, pin_memory=torch.cuda.is_available())")


def autoaccel(*args: str, cwd: Path, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """A real process with a time limit: a hang or a crash must not take the tests down."""
    return subprocess.run(
        [sys.executable, "-m", "autoaccel", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "NO_COLOR": "1"},
    )


# -- what is read -----------------------------------------------------------------------
@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_a_fifo_named_like_a_script_is_refused_without_blocking(tmp_path):
    os.mkfifo(tmp_path / "x.py")
    (tmp_path / "train.py").write_text(SCRIPT)
    walked = autoaccel("lint", *SELECT, ".", cwd=tmp_path, timeout=30)
    assert walked.returncode == 1  # met on the walk: skipped, as Ruff does
    assert "warning: x.py: a FIFO; skipped" in walked.stderr
    assert "train.py:4:10: ACC101" in walked.stdout
    run = autoaccel("lint", *SELECT, "x.py", "train.py", cwd=tmp_path, timeout=30)
    assert run.returncode == 2
    assert "x.py:1:1: error: is a FIFO; only regular files are read" in run.stderr
    assert "train.py:4:10: ACC101" in run.stdout
    convert = autoaccel("convert", "x.py", cwd=tmp_path, timeout=30)
    assert (convert.returncode, convert.stderr) == (
        2,
        "x.py:1:1: error: is a FIFO; only regular files are read\n",
    )


@pytest.mark.skipif(not os.path.exists("/dev/zero"), reason="no /dev/zero")
def test_a_link_to_an_endless_device_is_refused(tmp_path):
    (tmp_path / "x.py").symlink_to("/dev/zero")
    run = autoaccel("lint", "x.py", cwd=tmp_path, timeout=30)
    assert (run.returncode, run.stderr) == (
        2,
        "x.py:1:1: error: is a device; only regular files are read\n",
    )


def test_a_file_over_the_size_limit_is_refused(tmp_path):
    path = tmp_path / "big.py"
    path.write_text("x = 1\n" * 10)
    with pytest.raises(fileio.FileRefused, match="larger than"):
        fileio.read_bytes(path, limit=59)
    assert fileio.read_bytes(path, limit=60) == b"x = 1\n" * 10


def test_standard_input_over_the_size_limit_is_refused(cli, monkeypatch):
    from autoaccel.lint import command

    monkeypatch.setattr(command, "MAX_SOURCE_BYTES", 2**20)
    run = cli("lint", "-", input="import torch\n" + "#" * 2**20)
    assert (run.exit_code, run.stderr) == (2, "-:1:1: error: larger than 1 MiB; not read\n")


def test_a_symlink_loop_is_an_error_for_lint_and_convert(cli, tmp_path):
    (tmp_path / "loop.py").symlink_to("loop.py")
    (tmp_path / "train.py").write_text(SCRIPT)
    run = cli("lint", *SELECT, ".")
    assert run.exit_code == 2
    assert "loop.py:1:1: error: Too many levels of symbolic links" in run.stderr
    assert "train.py:4:10: ACC101" in run.stdout
    convert = cli("convert", "loop.py")
    assert convert.exit_code == 2
    assert convert.stderr == "loop.py:1:1: error: Too many levels of symbolic links\n"


def test_a_pyproject_that_is_not_utf8_is_named_in_the_error(cli, tmp_path):
    (tmp_path / "pyproject.toml").write_bytes(b"[tool.autoaccel]\nselect = ['\xff']\n")
    (tmp_path / "train.py").write_text(SCRIPT)
    message = f"{tmp_path / 'pyproject.toml'}: not UTF-8 (invalid start byte at byte 28)"
    run = cli("lint", "train.py")
    assert (run.exit_code, run.stderr) == (2, f"error: {message}\n")  # before any file is read
    convert = cli("convert", "train.py")
    assert (convert.exit_code, convert.stderr) == (2, f"error: {message}\n")


@pytest.mark.parametrize(
    "notebook, message",
    [
        ({"cells": [], "metadata": "x"}, "`metadata` is not an object"),
        ({"cells": [], "metadata": {"kernelspec": []}}, "`metadata.kernelspec` is not an object"),
        ({"cells": ["import torch"]}, "cell 1 is not an object"),
        ({"cells": [{"cell_type": "code", "source": 3}]}, "the source of cell 1 is not text"),
        (
            {"cells": [{"cell_type": "code", "source": ["x\n", None]}]},
            "the source of cell 1 is not text",
        ),
        (
            '{"cells": [], "metadata": ' + "[" * 100_000 + "]" * 100_000 + "}",
            "JSON nested too deeply",
        ),
    ],
    ids=[
        "metadata-string",
        "kernelspec-list",
        "cell-string",
        "source-int",
        "source-null",
        "deep-json",
    ],
)
def test_a_malformed_notebook_is_an_error(cli, tmp_path, notebook, message):
    path = tmp_path / "bad.ipynb"
    path.write_text(notebook if isinstance(notebook, str) else json.dumps(notebook))
    (tmp_path / "train.py").write_text(SCRIPT)
    run = cli("lint", *SELECT, "bad.ipynb", "train.py")
    assert run.exit_code == 2
    assert f"bad.ipynb:1:1: error: not a notebook: {message}\n" in run.stderr
    assert "train.py:4:10: ACC101" in run.stdout
    convert = cli("convert", "bad.ipynb")
    assert (convert.exit_code, convert.stderr) == (
        2,
        f"bad.ipynb:1:1: error: not a notebook: {message}\n",
    )


DEEP = {
    "brackets": "x = " + "(" * 2000 + "1" + ")" * 2000 + "\n",
    "sum": "x = " + " + ".join(["1"] * 2000) + "\n",
    "and": "x = " + " and ".join(["a"] * 10_000) + "\n",
    "dotted-import": "import a" + ".b" * 10_000 + "\n",
}


def test_deep_nesting_is_an_error_not_a_crash_and_the_folder_is_still_linted(tmp_path):
    """LibCST's parser segfaulted on each of these: a folder run printed nothing."""
    for name, source in DEEP.items():
        (tmp_path / f"{name}.py").write_text("import torch\n" + source)
    (tmp_path / "train.py").write_text(SCRIPT)
    run = autoaccel("lint", *SELECT, "--exit-zero", ".", cwd=tmp_path)
    assert run.returncode == 2
    assert "brackets.py:2:205: SyntaxError: too many nested parentheses" in run.stderr
    for name in ("sum", "and", "dotted-import"):
        assert f"{name}.py:2:" in run.stderr
        assert "too deeply nested for autoaccel: over 500 nested levels" in run.stderr
    assert "train.py:4:10: ACC101" in run.stdout
    convert = autoaccel("convert", "and.py", cwd=tmp_path)
    assert (convert.returncode, convert.stderr) == (
        2,
        "and.py:2:5: too deeply nested for autoaccel: over 500 nested levels\n",
    )


def test_nesting_python_accepts_but_the_converter_cannot_follow_is_an_error(cli, tmp_path):
    """Under the nesting limit but past Python's recursion limit in a transform."""
    path = tmp_path / "sum.py"
    path.write_text("import torch\nx = " + " + ".join(["1"] * 450) + "\n")
    run = cli("convert", "sum.py", "--write")
    assert (run.exit_code, run.stderr) == (2, "sum.py: error: too deeply nested for autoaccel\n")


@pytest.mark.skipif(multiprocessing.get_start_method() != "fork", reason="needs fork")
def test_a_worker_that_dies_costs_only_its_own_file(cli, tmp_path, monkeypatch):
    names = ["a.py", "b.py", "crash.py", "d.py", "e.py"]
    for name in names:
        (tmp_path / name).write_text(SCRIPT)
    real = runner.lint_text

    def lint_text(text, display_path, *args, **kwargs):
        if display_path.endswith("crash.py"):
            os.kill(os.getpid(), signal.SIGKILL)  # what a segfault in native code does
        return real(text, display_path, *args, **kwargs)

    monkeypatch.setattr(runner, "lint_text", lint_text)
    run = cli("lint", *SELECT, ".")
    assert run.exit_code == 2
    assert "crash.py:1:1: internal error: the process linting it died" in run.stderr
    for name in set(names) - {"crash.py"}:
        assert f"{name}:4:10: ACC101" in run.stdout


# -- what is written --------------------------------------------------------------------
def test_fixes_go_through_a_symlink_into_the_real_file(cli, tmp_path):
    real = tmp_path / "src" / "train.py"
    real.parent.mkdir()
    real.write_text(SCRIPT)
    (tmp_path / "train.py").symlink_to(real)
    run = cli("lint", *SELECT, "--fix", "train.py")
    assert run.exit_code == 1  # ACC101's fix is unsafe and remains
    assert (tmp_path / "train.py").is_symlink()
    assert real.read_text() == FIXED


def test_convert_write_goes_through_a_symlink(cli, tmp_path):
    real = tmp_path / "real.py"
    real.write_text(SCRIPT)
    (tmp_path / "train.py").symlink_to(real)
    assert cli("convert", "train.py", "--write").exit_code == 0
    assert (tmp_path / "train.py").is_symlink()
    assert "pin_memory=torch.cuda.is_available()" in real.read_text()


def test_a_read_only_file_is_refused_and_the_others_fixed(cli, tmp_path):
    locked = tmp_path / "locked.py"
    locked.write_text(SCRIPT)
    locked.chmod(0o444)
    (tmp_path / "open.py").write_text(SCRIPT)
    run = cli("lint", *SELECT, "--fix", "locked.py", "open.py")
    assert run.exit_code == 2
    assert (
        "locked.py:1:1: error: fixes not written: is read-only (mode 0444); not replaced"
        in run.stderr
    )
    assert locked.read_text() == SCRIPT
    assert stat.S_IMODE(locked.stat().st_mode) == 0o444
    assert (tmp_path / "open.py").read_text() == FIXED


def test_a_failing_write_is_reported_and_the_others_fixed(cli, tmp_path, monkeypatch):
    """An immutable file or a read-only folder: the rename fails."""
    for name in ("a.py", "b.py"):
        (tmp_path / name).write_text(SCRIPT)
    replace = os.replace

    def refuse_a(source, target):
        if Path(target).name == "a.py":
            raise PermissionError(1, "Operation not permitted")
        replace(source, target)

    monkeypatch.setattr(fileio.os, "replace", refuse_a)
    run = cli("lint", *SELECT, "--fix", "a.py", "b.py")
    assert run.exit_code == 2
    assert "a.py:1:1: error: fixes not written: Operation not permitted" in run.stderr
    assert (tmp_path / "a.py").read_text() == SCRIPT
    assert (tmp_path / "b.py").read_text() == FIXED
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.py", "b.py"]  # no temporary left


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="needs root to chown")
def test_a_file_of_another_user_keeps_its_owner(cli, tmp_path):
    path = tmp_path / "train.py"
    path.write_text(SCRIPT)
    os.chown(path, 4321, 4321)
    assert cli("lint", *SELECT, "--fix", "train.py").exit_code == 1
    assert path.read_text() == FIXED
    assert (path.stat().st_uid, path.stat().st_gid) == (4321, 4321)


@pytest.mark.skipif(not hasattr(os, "geteuid"), reason="no file owners here")
def test_a_file_of_another_user_is_refused_when_its_owner_cannot_be_kept(
    cli, tmp_path, monkeypatch
):
    path = tmp_path / "train.py"
    path.write_text(SCRIPT)
    monkeypatch.setattr(fileio.os, "geteuid", lambda: path.stat().st_uid + 1)

    def chown(*args):
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(fileio.os, "chown", chown)
    run = cli("lint", *SELECT, "--fix", "train.py")
    assert run.exit_code == 2
    assert "belongs to another user" in run.stderr
    assert path.read_text() == SCRIPT


def test_an_edit_made_while_fixing_is_kept(cli, tmp_path, monkeypatch):
    path = tmp_path / "train.py"
    path.write_text(SCRIPT)
    edited = SCRIPT + "# typed in the editor meanwhile\n"
    real = runner.lint_text

    def lint_text(*args, **kwargs):
        result = real(*args, **kwargs)
        path.write_text(edited)
        return result

    monkeypatch.setattr(runner, "lint_text", lint_text)
    run = cli("lint", *SELECT, "--fix", "train.py")
    assert run.exit_code == 2
    assert "changed while autoaccel worked on it; nothing written" in run.stderr
    assert path.read_text() == edited


@pytest.mark.parametrize(
    "target, message",
    [
        ("folder", "is a directory; only regular files are replaced"),
        ("missing/out.py", "no such folder"),
    ],
)
def test_output_into_a_folder_or_a_missing_folder_is_an_error(cli, tmp_path, target, message):
    (tmp_path / "folder").mkdir()
    (tmp_path / "train.py").write_text(SCRIPT)
    run = cli("convert", "train.py", "-o", target)
    assert run.exit_code == 2
    assert f"error: not written: {message}" in run.stderr
    assert sorted(p.name for p in (tmp_path / "folder").iterdir()) == []
    assert not (tmp_path / "missing").exists()


@pytest.mark.skipif(not os.path.exists("/dev/null"), reason="no /dev/null")
def test_output_to_a_device_leaves_the_device_alone(cli, tmp_path):
    (tmp_path / "train.py").write_text(SCRIPT)
    run = cli("convert", "train.py", "-o", "/dev/null")
    assert run.exit_code == 2
    assert "/dev/null: error: not written: is a device" in run.stderr
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)


DDP_SCRIPT = """\
import torch
from torch.utils.data import DataLoader

model = torch.nn.Linear(4, 2).cuda()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
loader = DataLoader(dataset, batch_size=32)
for x, y in loader:
    loss = torch.nn.functional.cross_entropy(model(x.cuda()), y.cuda())
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
"""


@pytest.mark.parametrize("launcher, name", [("slurm", "train.sbatch"), ("spawn", "spawn_train.py")])
def test_an_existing_launcher_file_is_kept_unless_forced(cli, tmp_path, launcher, name):
    script = tmp_path / "train.py"
    script.write_text(DDP_SCRIPT)
    mine = tmp_path / name
    mine.write_text("# my own launcher\n")
    args = ("convert", "train.py", "--to", "ddp", "--launcher", launcher, "--write", "--no-verify")
    run = cli(*args)
    assert run.exit_code == 2
    assert run.stderr == (
        f"{name}: error: exists with other contents; not replaced, and nothing written"
        " (--force replaces it)\n"
    )
    assert (mine.read_text(), script.read_text()) == ("# my own launcher\n", DDP_SCRIPT)
    assert cli(*args, "--force").exit_code == 0
    assert mine.read_text() != "# my own launcher\n"
    assert cli(*args).exit_code == 0  # its own file is not a clash


def test_bench_report_naming_a_file_is_an_error_before_anything_runs(cli, tmp_path):
    (tmp_path / "train.py").write_text(DDP_SCRIPT)
    (tmp_path / "report").write_text("not a folder\n")
    run = cli("bench", "train.py", "--report", "report")
    assert run.exit_code == 2
    assert "report: error: --report names a folder to write into; this is a file" in run.stderr
    assert (tmp_path / "report").read_text() == "not a folder\n"


def test_a_new_output_file_follows_the_umask(cli, tmp_path):
    """mkstemp makes 0600 files; `-o` writes one as `open()` would (0644 under umask 022)."""
    (tmp_path / "train.py").write_text(SCRIPT)
    old = os.umask(0o022)
    try:
        run = cli("convert", "train.py", "-o", "fast.py")
    finally:
        os.umask(old)
    assert run.exit_code == 0, run.stderr
    assert stat.S_IMODE((tmp_path / "fast.py").stat().st_mode) == 0o644
