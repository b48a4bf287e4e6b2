"""Run `autoaccel tune` / `autoaccel bench` as a user would, in a subprocess (a plain
module, imported by tests)."""

from __future__ import annotations

import os
import subprocess
import sys
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Iterator

import pytest

from running import FIXTURES_DIR


def autoaccel(command: str, script: Path, *options: str, cwd: Path) -> subprocess.CompletedProcess:
    """`autoaccel COMMAND SCRIPT *options` in `cwd`, one intra-op thread, a wide terminal."""
    return subprocess.run(
        [sys.executable, "-m", "autoaccel", command, str(script), *options],
        cwd=cwd, capture_output=True, text=True, timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "120"},
    )


def runs_on_fixtures(test: str, command: str, *options: str):
    """A module-scoped pytest fixture: name -> future of `autoaccel COMMAND FIXTURE *options`,
    started for every fixture the selected runs of `test` (parametrized by `name`) need,
    two at a time; each test waits for its own."""

    @pytest.fixture(scope="module")
    def fixture_runs(request, tmp_path_factory) -> Iterator[dict[str, Future]]:
        pytest.importorskip("torch")
        selected = sorted({
            item.callspec.params["name"]
            for item in request.session.items
            if item.originalname == test and hasattr(item, "callspec")
        })
        with ThreadPoolExecutor(max_workers=2) as pool:
            yield {
                name: pool.submit(
                    autoaccel, command, FIXTURES_DIR / name, *options,
                    cwd=tmp_path_factory.mktemp(name.removesuffix(".py")),
                )
                for name in selected
            }

    return fixture_runs
