"""Helpers for tests that convert fixtures and run them (a plain module, imported by tests).

`convert` runs `autoaccel convert` in a subprocess, `run_under_harness` runs a script under
`autoaccel.harness`, which records the loss of every backward call. `SessionRuns` (the
`session_runs` fixture of conftest.py) does each of those once per test session, and runs
the jobs of the run tests in the background.

A test module whose tests wait for such jobs defines `start_runs(shared, tests)`: it starts
(`shared.start`) the jobs its selected `runs` tests need and returns their futures, which
its tests read through the fixture `runs_fixture(start_runs)`. conftest.py calls every
module's `start_runs` before the first test of the session, so the jobs run on the second
core while the unit tests keep the first one busy.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Callable, Hashable, Iterable, TypeVar

import pytest

FIXTURES_DIR = Path(__file__).resolve().parent.parent / "fixtures"
TIMEOUT_S = 120
DDP_OPTIONS = ("--to", "ddp", "--amp", "off")
# Fixtures without a DataLoader: the conversion cannot shard their data, so it refuses;
# `--allow-partial` writes it (every rank then trains on all the data).
UNSHARDED = {"lstm_lm.py"}
# Jobs run side by side in the background (the machine the suite is timed on has 2 cores;
# with the test that runs meanwhile, that keeps both busy).
BACKGROUND_THREADS = 2


def fixture_names() -> list[str]:
    """The fixture scripts, sorted (hidden files, e.g. an editor's, are not fixtures)."""
    return sorted(p.name for p in FIXTURES_DIR.glob("*.py") if not p.name.startswith("."))


def runs_tests_by_module(items: Iterable) -> dict[ModuleType, list]:
    """The tests marked `runs` among pytest's `items`, by module, in their order."""
    tests: dict[ModuleType, list] = {}
    for item in items:
        if item.get_closest_marker("runs"):
            tests.setdefault(item.module, []).append(item)
    return tests


def selected(items: Iterable, param: str = "name", default: Hashable = None) -> list:
    """The values the pytest `items` take for parameter `param`, sorted, each once; an item
    without it counts as `default` (left out when that is None)."""
    values = {item.callspec.params.get(param, default) if hasattr(item, "callspec") else default
              for item in items}  # fmt: skip
    return sorted(values - {None})


def _env(extra: dict[str, str] | None = None) -> dict[str, str]:
    # One intra-op thread: the scripts are tiny, and several run side by side on 2 cores.
    return {**os.environ, "PYTHONHASHSEED": "0", "OMP_NUM_THREADS": "1", **(extra or {})}


def _check(proc: subprocess.CompletedProcess, what: str) -> None:
    if proc.returncode != 0:
        print(proc.stderr, file=sys.stderr)
        raise AssertionError(
            f"{what} exited with {proc.returncode}\n--- stderr (tail) ---\n{proc.stderr[-3000:]}"
        )


@dataclass(frozen=True)
class HarnessRun:
    """A script's run under the harness: how it ended, and the folder it ran in (its
    checkpoints are there)."""

    name: str
    cwd: Path
    returncode: int
    stderr: str
    record: dict

    def check(self) -> HarnessRun:
        """This run; AssertionError with the end of its stderr when it failed."""
        if self.returncode != 0:
            raise AssertionError(
                f"harness run of {self.name} exited with {self.returncode}\n"
                f"--- stderr (tail) ---\n{self.stderr[-3000:]}"
            )
        return self

    @property
    def losses(self) -> list[float]:
        """The loss of every backward call; AssertionError when the run failed."""
        return self.check().record["losses"]


def run_under_harness(script_path, args, cwd, env=None, max_steps=None) -> HarnessRun:
    """Run `script_path args...` under the harness in `cwd`."""
    out = Path(cwd) / f"losses-{Path(script_path).stem}.json"
    cmd = [sys.executable, "-m", "autoaccel.harness", "--losses-out", str(out)]
    if max_steps is not None:
        cmd += ["--max-steps", str(max_steps)]
    cmd += [str(script_path), *map(str, args)]
    proc = subprocess.run(
        cmd, cwd=cwd, env=_env(env), capture_output=True, text=True, timeout=TIMEOUT_S
    )
    record = json.loads(out.read_text()) if out.is_file() else {}
    return HarnessRun(Path(script_path).name, Path(cwd), proc.returncode, proc.stderr, record)


def run_with_losses(script_path, args, tmp_path, env=None, max_steps=None) -> list[float]:
    """Run `script_path args...` under the harness in `tmp_path`; return the recorded losses."""
    return run_under_harness(script_path, args, tmp_path, env, max_steps).losses


def ddp_options(name: str) -> tuple[str, ...]:
    """The options the tests convert fixture `name` with for `--to ddp`: `--allow-partial`
    only where the conversion refuses, so that the snapshot and the runs share it."""
    return DDP_OPTIONS + (("--allow-partial",) if name in UNSHARDED else ())


def _fixture_path(fixture) -> Path:
    fixture = Path(fixture)
    return fixture if fixture.is_absolute() else FIXTURES_DIR / fixture


def convert(fixture, tmp_path, *options: str) -> Path:
    """`autoaccel convert FIXTURE -o OUT *options`; returns OUT (a file in `tmp_path`)."""
    fixture = _fixture_path(fixture)
    tag = "".join(o.strip("-") for o in options) or "default"
    out = Path(tmp_path) / f"{fixture.stem}.{tag}.py"
    proc = subprocess.run(
        [sys.executable, "-m", "autoaccel", "convert", str(fixture), "-o", str(out), *options],
        cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=TIMEOUT_S,
    )
    _check(proc, f"autoaccel convert {fixture.name} {' '.join(options)}")
    return out


Result = TypeVar("Result")


class SessionRuns:
    """Harness runs and conversions that several test modules need, each done once per
    session (each fixture's original used to run four times a session): a run is keyed
    by the script's content, its arguments and environment, a conversion by the
    fixture's content and the options. Safe to call from several threads; callers that
    ask for what is under way wait for it. Callers read the results and never change
    the files: a script that must be edited is converted with `convert` instead.

    `start` runs a test module's jobs (which call the above) on background threads."""

    def __init__(self, root: Path) -> None:
        self._root = root
        self._lock = threading.Lock()
        self._results: dict[tuple, Future] = {}
        self._started: dict[tuple, Future] = {}
        self._pool = ThreadPoolExecutor(BACKGROUND_THREADS, thread_name_prefix="session-runs")

    def start(self, job: Callable[..., Result], *args: Hashable) -> Future:
        """The future of `job(self, *args)`, queued on the background threads by the first
        caller with the same job and arguments. The jobs start in the order they are
        asked for; a job must not wait for another started job (it might wait for ever)."""
        with self._lock:
            key = (job, args)
            if key not in self._started:
                self._started[key] = self._pool.submit(job, self, *args)
            return self._started[key]

    def folder(self, name: str) -> Path:
        """A new empty folder, its name starting with `name`, for a job's files."""
        return Path(tempfile.mkdtemp(prefix=f"{name}-", dir=self._root))

    def close(self) -> None:
        """Drop the jobs not yet started (the session ends early) and wait for the others."""
        self._pool.shutdown(cancel_futures=True)

    def run(self, script, args=(), env: dict[str, str] | None = None) -> HarnessRun:
        """`run_under_harness(script, args)` in a folder of its own."""
        script = Path(script)
        settings = (tuple(map(str, args)), tuple(sorted((env or {}).items())))
        return self._once(
            "run", script, settings, lambda folder: run_under_harness(script, args, folder, env)
        )

    def convert(self, fixture, *options: str) -> Path:
        """`convert(fixture, folder, *options)`: the converted file."""
        fixture = _fixture_path(fixture)
        return self._once(
            "convert", fixture, options, lambda folder: convert(fixture, folder, *options)
        )

    def _once(self, kind: str, script: Path, settings: tuple, make: Callable[[Path], Result]) -> Result:
        """`make(folder)` for the first caller of (kind, script content, settings); the
        others get its result (or its exception) when it is done."""
        key = (kind, hashlib.sha256(script.read_bytes()).hexdigest(), settings)
        with self._lock:
            future = self._results.get(key)
            mine = future is None
            if mine:
                future = self._results[key] = Future()
        if mine:
            digest = hashlib.sha256(repr(key).encode()).hexdigest()[:12]
            try:
                folder = self._root / f"{kind}-{script.stem}-{digest}"
                folder.mkdir()
                future.set_result(make(folder))
            except Exception as error:  # every caller of this key gets it
                future.set_exception(error)
        return future.result()


def runs_fixture(start_runs: Callable[[SessionRuns, list], Result]):
    """A module-scoped pytest fixture: what `start_runs` returns for the module's selected
    tests marked `runs` (the futures of the jobs conftest.py started already)."""

    @pytest.fixture(scope="module")
    def started(request, session_runs: SessionRuns) -> Result:
        tests = runs_tests_by_module(request.session.items).get(request.module, [])
        return start_runs(session_runs, tests)

    return started
