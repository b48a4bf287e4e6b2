"""Shared fixtures: a script with known findings and a CLI runner, and the session's shared
harness runs and conversions."""

from __future__ import annotations

import textwrap
from pathlib import Path
from dataclasses import dataclass
from collections.abc import Iterator

import pytest
from typer.testing import CliRunner

from autoaccel.__main__ import rule_codes
from autoaccel.cli import app
from autoaccel.config import use_rule_catalog
from running import SessionRuns, runs_tests_by_module

# What the `autoaccel` command registers before it runs any command (the CLI runner and
# the tests that read settings start below it).
use_rule_catalog(rule_codes)

# ACC101 (unsafe fix) and ACC102 (safe fix) both fire on line 4, column 10.
SCRIPT = textwrap.dedent("""\
    import torch
    from torch.utils.data import DataLoader

    loader = DataLoader(dataset, batch_size=32)
    model.cuda()
    for x, y in loader:
        model(x).sum().backward()
    """)
CLEAN = textwrap.dedent("""\
    import torch
    from torch.utils.data import DataLoader

    loader = DataLoader(dataset, num_workers=4, pin_memory=True)
    model.cuda()
    """)
# The two rules every CLI test selects, so that rules added later do not change them.
SELECT = ["--select", "ACC101,ACC102"]


@dataclass
class Run:
    exit_code: int
    stdout: str
    stderr: str


@pytest.fixture
def cli(tmp_path, monkeypatch):
    """`cli("lint", "a.py")` runs the command in `tmp_path` and returns a `Run`."""
    monkeypatch.chdir(tmp_path)

    def run(*args: str, input: str | None = None) -> Run:
        result = CliRunner().invoke(app, list(args), input=input, catch_exceptions=False)
        return Run(result.exit_code, result.stdout, result.stderr)

    return run


@pytest.fixture
def proven(cli, tmp_path):
    """`proven(script, target)` converts a copy of the fixture `script` (as train.py, amp
    off) with its proof: written, the parameters equal on every process. The code written."""

    def convert(script: Path, target: str) -> str:
        (tmp_path / "train.py").write_text(script.read_text(encoding="utf-8"))
        run = cli("convert", "train.py", "--to", target, "--amp", "off", "-o", "out.py")
        assert run.exit_code == 0, run.stderr
        assert "--verify ok   parameters equal on every process" in run.stderr
        return (tmp_path / "out.py").read_text()

    return convert


@pytest.fixture(scope="session")
def session_runs(tmp_path_factory) -> Iterator[SessionRuns]:
    """Harness runs and conversions done once for the whole session (see running.py)."""
    shared = SessionRuns(tmp_path_factory.mktemp("session-runs"))
    yield shared
    shared.close()


@pytest.fixture(scope="session", autouse=True)
def runs_started_early(request, session_runs) -> None:
    """Before the first test, start the background jobs of every selected `runs` test (each
    module's `start_runs`, see running.py), in the order of the tests. `-m "not runs"`
    starts none. Under pytest-xdist (`-n 2 --dist loadfile`) nothing starts early: a worker
    does not know which modules it will get, and each module's jobs start with its first test."""
    if hasattr(request.config, "workerinput"):
        return
    for module, tests in runs_tests_by_module(request.session.items).items():
        if hasattr(module, "start_runs"):
            module.start_runs(session_runs, tests)
