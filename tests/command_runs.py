"""Run `autoaccel tune` / `autoaccel bench` as a user would, in a process of its own (a
plain module, imported by tests)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from pathlib import Path

from running import FIXTURES_DIR, SESSION_ENV, SessionRuns, _python, selected


def autoaccel(
    command: str, script: Path, *options: str, cwd: Path, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess:
    """`autoaccel COMMAND SCRIPT *options` in `cwd`, one intra-op thread, a wide terminal,
    with `env` (by default this process's environment, as a test may have set it), forked
    from the fork server where it may (running.py). The hash seed is fixed, as for the
    tests' own runs: then `tune`'s measurement, which inherits it, may fork from the fork
    server too (a random one cannot be set after start)."""
    env = {
        **(os.environ if env is None else env),
        "OMP_NUM_THREADS": "1",
        "COLUMNS": "120",
        "PYTHONHASHSEED": "0",
    }
    return _python({"module": "autoaccel"}, [command, str(script), *options], cwd, env, timeout=300)


def _on_fixture(
    shared: SessionRuns, command: str, name: str, options: tuple[str, ...]
) -> subprocess.CompletedProcess:
    folder = shared.folder(f"{command}-{name.removesuffix('.py')}")
    return autoaccel(command, FIXTURES_DIR / name, *options, cwd=folder, env=SESSION_ENV)


def runs_on_fixtures(
    test: str, command: str, *options: str
) -> Callable[[SessionRuns, list], dict[str, Future]]:
    """A module's `start_runs` (see running.py): name -> future of `autoaccel COMMAND
    FIXTURE *options`, for every fixture the selected runs of `test` (parametrized by
    `name`) need."""

    def start_runs(shared: SessionRuns, tests: list) -> dict[str, Future]:
        names = selected(item for item in tests if item.originalname == test)
        return {name: shared.start(_on_fixture, command, name, options) for name in names}

    return start_runs
