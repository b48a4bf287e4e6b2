"""Proof by running (T11 of bench 32): fixtures/facts/logger_class converted with `--to
ddp` (tests/test_convert_log_writers.py) and run on 2 processes (gloo, CPU). The project's
`Logger` wrote log.txt from every process, which the proof refused ("2 processes wrote
checkpoint/log.txt"); now rank 0 alone writes it, and every check of the proof passes."""

from __future__ import annotations

import shutil

import pytest

from autoaccel.convert import command
from autoaccel.convert.log import ConvertOptions
from autoaccel.convert.verify import VerifyRequest
from running import FIXTURES_DIR

pytest.importorskip("torch")
pytestmark = pytest.mark.runs


def test_one_process_writes_the_log_of_the_project_logger(tmp_path, capsys):
    shutil.copytree(FIXTURES_DIR / "facts" / "logger_class", tmp_path / "project")
    script, output = tmp_path / "project" / "train.py", tmp_path / "converted.py"
    options = ConvertOptions(target="ddp", amp="off")
    verify = VerifyRequest([], steps=8)
    assert command.run_convert(script, options, output=output, verify=verify) == 0
    assert "else NoWriter()" in output.read_text()
    assert "Proven by a run on 2 CPU processes" in capsys.readouterr().out


def test_every_process_saves_into_rank_zeros_default_writer_folder(tmp_path, monkeypatch):
    """fixtures/ddp/default_log_dir.py under the proof (2 processes, tests/stubs' writer
    names its default folder after its process): one folder, rank 0's, holds the events
    and the checkpoint."""
    stubs = FIXTURES_DIR.parent / "tests" / "stubs"
    monkeypatch.setenv("PYTHONPATH", str(stubs))
    monkeypatch.chdir(tmp_path)
    shutil.copy(FIXTURES_DIR / "ddp" / "default_log_dir.py", tmp_path / "train.py")
    options = ConvertOptions(target="ddp", amp="off")
    verify = VerifyRequest([])  # its 8 steps in all: all of them
    output = tmp_path / "converted.py"
    assert command.run_convert(tmp_path / "train.py", options, output=output, verify=verify) == 0
    assert "with_rank_zero_log_dir(" in output.read_text()
