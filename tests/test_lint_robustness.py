"""`autoaccel lint` on what a folder may hold besides scripts: unreadable files and
folders, names that are not UTF-8, FIFOs, sockets and broken links."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import SCRIPT, SELECT


def _mode_bits_bind() -> list[str]:
    """A command prefix under which `chmod 000` stops reads: none for a user; for root,
    `setpriv` without the capabilities that override file permissions."""
    if os.geteuid() != 0:
        return []
    drop = "-dac_override,-dac_read_search"
    prefix = ["setpriv", f"--inh-caps={drop}", f"--bounding-set={drop}"]
    if shutil.which("setpriv") is None or subprocess.run([*prefix, "true"]).returncode != 0:
        pytest.skip("root, and no setpriv to give up overriding file permissions")
    return prefix


@pytest.fixture
def project(tmp_path):
    """`p/a.py` with findings, `p/locked/b.py` in a folder of mode 000 and `p/c.py` of
    mode 000 (modes restored afterwards, for the clean-up)."""
    (tmp_path / "p" / "locked").mkdir(parents=True)
    (tmp_path / "p" / "a.py").write_text(SCRIPT)
    (tmp_path / "p" / "locked" / "b.py").write_text(SCRIPT)
    (tmp_path / "p" / "c.py").write_text(SCRIPT)
    os.chmod(tmp_path / "p" / "c.py", 0)
    os.chmod(tmp_path / "p" / "locked", 0)
    yield tmp_path / "p"
    os.chmod(tmp_path / "p" / "locked", 0o755)
    os.chmod(tmp_path / "p" / "c.py", 0o644)


@pytest.mark.skipif(not hasattr(os, "geteuid"), reason="POSIX permissions")
@pytest.mark.parametrize(
    ("paths", "unreadable"),
    [
        pytest.param(["p"], ["p/c.py", "p/locked"], id="walked"),
        pytest.param(["p/locked", "p/a.py"], ["p/locked"], id="folder-given"),
        pytest.param(
            ["p/locked/b.py", "p/c.py", "p/a.py"], ["p/c.py", "p/locked/b.py"], id="files-given"
        ),
    ],
)
def test_what_may_not_be_read_is_an_error_and_the_rest_is_linted(project, paths, unreadable):
    run = subprocess.run(
        [*_mode_bits_bind(), sys.executable, "-m", "autoaccel", "lint", *SELECT, *paths],
        cwd=project.parent,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 2, run.stderr
    assert "Traceback" not in run.stderr
    errors = sorted(line for line in run.stderr.splitlines() if "error:" in line)
    assert errors == [f"{path}:1:1: error: Permission denied" for path in unreadable]
    assert "p/a.py:4:10: ACC101" in run.stdout


def test_a_folder_the_walk_cannot_list_is_an_error(cli, tmp_path, monkeypatch):
    """As above where no user can be made to lack permissions: the listing fails as it would."""
    (tmp_path / "p" / "locked").mkdir(parents=True)
    (tmp_path / "p" / "a.py").write_text(SCRIPT)
    listing = os.scandir

    def scandir(path="."):
        if Path(path) == Path("p/locked"):
            raise PermissionError(13, "Permission denied", os.fspath(path))
        return listing(path)

    monkeypatch.setattr(os, "scandir", scandir)
    run = cli("lint", *SELECT, "p")
    assert run.exit_code == 2
    assert run.stderr.splitlines()[0] == "p/locked:1:1: error: Permission denied"
    assert run.stdout.startswith("p/a.py:4:10: ACC101")


NOT_UTF8 = os.fsdecode(b"bad\xff\xfe.py")


def test_sarif_percent_encodes_a_name_that_is_not_utf8(cli, tmp_path):
    (tmp_path / NOT_UTF8).write_text(SCRIPT)
    run = cli("lint", *SELECT, "--format", "sarif", ".")
    assert run.exit_code == 1
    result, _ = json.loads(run.stdout)["runs"][0]["results"]
    location = result["locations"][0]["physicalLocation"]["artifactLocation"]
    assert location == {"uri": "bad%FF%FE.py", "uriBaseId": "%SRCROOT%"}


def test_json_writes_the_bytes_of_a_name_that_is_not_utf8_as_escapes(cli, tmp_path):
    (tmp_path / NOT_UTF8).write_text(SCRIPT)
    run = cli("lint", *SELECT, "--format", "json", ".")
    assert run.exit_code == 1
    assert {record["filename"] for record in json.loads(run.stdout)} == {"bad\\xff\\xfe.py"}
    run.stdout.encode("utf-8")  # no lone surrogates left to fail a strict reader


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_a_walk_skips_what_is_not_a_regular_file_with_a_warning(cli, tmp_path):
    (tmp_path / "p").mkdir()
    (tmp_path / "p" / "a.py").write_text(SCRIPT)
    (tmp_path / "p" / "gone.py").symlink_to("missing.py")
    os.mkfifo(tmp_path / "p" / "pipe.py")
    with socket.socket(socket.AF_UNIX) as server:
        server.bind("p/sock.py")  # relative: a socket's path is short
        run = cli("lint", *SELECT, "p")
    assert run.exit_code == 1, run.stderr
    assert run.stdout.startswith("p/a.py:4:10: ACC101")
    for warning in (
        "warning: p/gone.py: a broken symbolic link; skipped",
        "warning: p/pipe.py: a FIFO; skipped",
        "warning: p/sock.py: a socket; skipped",
    ):
        assert warning in run.stderr.splitlines()


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_a_fifo_given_by_name_is_still_an_error(cli, tmp_path):
    os.mkfifo(tmp_path / "pipe.py")
    run = cli("lint", "pipe.py")
    message = "pipe.py:1:1: error: is a FIFO; only regular files are read\n"
    assert (run.exit_code, run.stderr) == (2, message)


def test_a_broken_link_given_by_name_is_still_an_error(cli, tmp_path):
    (tmp_path / "gone.py").symlink_to("missing.py")
    run = cli("lint", "gone.py")
    assert (run.exit_code, run.stderr) == (2, "gone.py:1:1: error: no such file or directory\n")
