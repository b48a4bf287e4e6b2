"""Helpers for tests that convert fixtures and run them (a plain module, imported by tests).

`convert` runs `autoaccel convert` in a subprocess, `run_under_harness` runs a script under
`autoaccel.run.harness`, which records the loss of every backward call. `SessionRuns` (the
`session_runs` fixture of conftest.py) does each of those once per test session, and runs
the jobs of the run tests in the background.

A test module whose tests wait for such jobs defines `start_runs(shared, tests)`: it starts
(`shared.start`) the jobs its selected `runs` tests need and returns their futures, which
its tests read through the fixture `runs_fixture(start_runs)`, which starts them with the
module's first test. In a session of one process, conftest.py calls every module's
`start_runs` before the first test, so the jobs run on the second core while the unit tests
keep the first one busy; under pytest-xdist (the README's command) the two workers keep the
cores busy instead.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TypeVar
from collections.abc import Callable, Hashable, Iterable

import pytest

FIXTURES_DIR = Path(__file__).resolve().parent.parent / "fixtures"
TIMEOUT_S = 120
DDP_OPTIONS = ("--to", "ddp", "--amp", "off")
# Jobs run side by side in the background (the machine the suite is timed on has 2 cores;
# with the test that runs meanwhile, that keeps both busy).
BACKGROUND_THREADS = 2


def fixture_names() -> list[str]:
    """The fixture scripts, sorted (hidden files, e.g. an editor's, are not fixtures)."""
    return sorted(p.name for p in FIXTURES_DIR.glob("*.py") if not p.name.startswith("."))


def sigint_as_from_a_terminal() -> None:
    """`preexec_fn` of a process a test interrupts with SIGINT, as Ctrl-C in a terminal
    would: a suite started in the background of a non-interactive shell (`bash .ci/run &`)
    ignores SIGINT, and its children inherit that (Python then installs no handler)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


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


# The environment the session started with. Runs read this, not `os.environ`: they run on
# background threads while the tests on the main thread set variables for themselves
# (`monkeypatch.setenv("AUTOACCEL_FORCE_AUTOCAST", "1")`, `WORLD_SIZE`), which must not
# reach another test's run (and would also keep runs from the fork server).
SESSION_ENV = dict(os.environ)


def _env(extra: dict[str, str] | None = None) -> dict[str, str]:
    # One intra-op thread: the scripts are tiny, and several run side by side on 2 cores.
    return {**SESSION_ENV, "PYTHONHASHSEED": "0", "OMP_NUM_THREADS": "1", **(extra or {})}


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
    """Run `script_path args...` under the harness in `cwd`: `python -m autoaccel.run.harness`,
    or the same forked from the fork server where it may (see `_ForkServer`)."""
    out = Path(cwd) / f"losses-{Path(script_path).stem}.json"
    harness_args = ["--losses-out", str(out)]
    if max_steps is not None:
        harness_args += ["--max-steps", str(max_steps)]
    harness_args += [str(script_path), *map(str, args)]
    proc = _python({"module": "autoaccel.run.harness"}, harness_args, Path(cwd), _env(env))
    record = json.loads(out.read_text()) if out.is_file() else {}
    return HarnessRun(Path(script_path).name, Path(cwd), proc.returncode, proc.stderr, record)


def _python(
    what: dict[str, str],
    args: list[str],
    cwd: Path,
    env: dict[str, str],
    timeout: float = TIMEOUT_S,
) -> subprocess.CompletedProcess:
    """`python -m MODULE *args` (`what`: `{"module": MODULE}`) or `python SCRIPT *args`
    (`{"script": SCRIPT}`) in `cwd`, output captured, killed after `timeout` seconds;
    forked from the fork server where it may (see `_ForkServer`)."""
    server = _fork_server()
    if server is not None and server.accepts(env):
        proc = server.run(what, args, cwd, env, timeout)
        if proc is not None:
            return proc
    launch = ["-m", what["module"]] if "module" in what else [what["script"]]
    return subprocess.run(
        [sys.executable, *launch, *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def run_script(
    script, args=(), cwd=None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """`python SCRIPT ARGS` in `cwd` (by default the script's folder), with the runs'
    environment (`_env`, plus `env`), output captured, TIMEOUT_S; forked from the fork
    server where it may, which saves the ~1.1 CPU-s of `import torch`."""
    script = Path(script).absolute()
    return _python(
        {"script": str(script)}, [*map(str, args)], Path(cwd or script.parent), _env(env)
    )


def run_autoaccel(
    *args, cwd, env: dict[str, str] | None = None, timeout: float = TIMEOUT_S
) -> subprocess.CompletedProcess:
    """`python -m autoaccel ARGS` in `cwd`, with the runs' environment (`_env`, plus `env`),
    output captured; forked from the fork server where it may: it has imported and warmed up
    the conversion pipeline, which saves ~0.7 CPU-s of a ~0.9 s `convert`."""
    return _python({"module": "autoaccel"}, [*map(str, args)], Path(cwd), _env(env), timeout)


def convert_in_copy(
    tmp_path: Path, project: Path, script: str, *args: object
) -> subprocess.CompletedProcess:
    """`autoaccel convert SCRIPT ARGS` in a copy of the fixture `project` folder (under
    `tmp_path / "project"`), so that what its runs write stays in the test's folder."""
    folder = tmp_path / "project"
    shutil.copytree(project, folder)
    return run_autoaccel("convert", script, *args, cwd=folder)


# The fork server: one process that has imported torch and the harness, forking one child
# per harness run (tests/forkserver.py). A run skips the ~1.1 s CPU of `import torch` (the
# runs tests make ~180 harness runs). The tests' `python -m autoaccel` runs (`convert`,
# ~120 a session) fork from it too: it has imported and warmed up the conversion pipeline
# (forked from a server without it, they cost as much CPU as fresh ones). The scripts the
# tests run themselves come here through `run_script`. AUTOACCEL_TESTS_FORK_SERVER=0
# starts a fresh process for each run instead.
FORK_SERVER = Path(__file__).resolve().with_name("forkserver.py")
FORK_SERVER_ENV = "AUTOACCEL_TESTS_FORK_SERVER"
# The variables in which a forked run's environment may differ from the server's: read
# while the script runs, never when the interpreter or torch starts. Any other difference
# (ONEDNN_MAX_CPU_ISA, ATEN_CPU_CAPABILITY, OMP_NUM_THREADS, ...) gets a fresh process.
# COLUMNS: `rich`'s width.
READ_WHILE_RUNNING = {"AUTOACCEL_FORCE_AUTOCAST", "PYTEST_CURRENT_TEST", "COLUMNS"}
# The same for the runs the product starts (`AUTOACCEL_PYTHON`, below): the variables the
# harness reads (facts), and those torchrun gives its workers (below). The server applies
# PYTHONPATH and PYTHONUNBUFFERED itself.
PRODUCT_READ_WHILE_RUNNING = {"AUTOACCEL_FACTS_OUT", "TORCHELASTIC_ERROR_FILE"}


class _ForkServer:
    """The client of tests/forkserver.py: `run` sends a request and waits for the child's
    exit. Safe to call from several threads (the children run side by side)."""

    def __init__(self, env: dict[str, str], product: _ProductRuns | None = None) -> None:
        self.env = env
        self.outputs = Path(tempfile.mkdtemp(prefix="autoaccel-fork-server-"))
        serves = []
        if product is not None:
            may_differ = READ_WHILE_RUNNING | TORCHRUN_WORKER_VARIABLES | PRODUCT_READ_WHILE_RUNNING
            serves = [
                str(product.listener.fileno()),
                str(product.shim),
                ",".join(sorted(may_differ)),
            ]
        self._proc = subprocess.Popen(
            [sys.executable, str(FORK_SERVER), *serves], env=env, stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, text=True, bufsize=1,
            pass_fds=[product.listener.fileno()] if product else (),
        )  # fmt: skip
        self._lock = threading.Lock()
        self._count = 0
        self._pids: dict[str, Future] = {}
        self._exits: dict[str, Future] = {}
        threading.Thread(target=self._read, name="fork-server", daemon=True).start()

    def accepts(self, env: dict[str, str], may_differ: frozenset[str] = READ_WHILE_RUNNING) -> bool:
        """Whether a run with this environment may be forked from the server."""
        differ = {k for k in env.keys() | self.env.keys() if env.get(k) != self.env.get(k)}
        return self._proc.poll() is None and differ <= may_differ

    def run(
        self, what: dict[str, str], args: list[str], cwd: Path, env: dict[str, str], timeout: float
    ) -> subprocess.CompletedProcess | None:
        """`python -m MODULE *args` or `python SCRIPT *args` (`what`, as for `start`) in
        `cwd`, forked; None when the server would not fork (the caller starts a fresh process)."""
        child = self.start(what, args, cwd, env)
        return child.wait(timeout) if child.forked(timeout) else None

    def start(
        self, what: dict[str, str], args: list[str], cwd: Path, env: dict[str, str]
    ) -> _Child:
        """Ask for a child running `what` (`{"module": M}` or `{"script": PATH}`) with `args`."""
        with self._lock:
            self._count += 1
            ident = str(self._count)
            pid, ended = self._pids[ident], self._exits[ident] = Future(), Future()
            out, err = self.outputs / f"{ident}.out", self.outputs / f"{ident}.err"
            request = {
                "id": ident, **what, "cwd": str(cwd), "env": env, "argv": args,
                "stdout": str(out), "stderr": str(err),
            }  # fmt: skip
            self._proc.stdin.write(json.dumps(request) + "\n")
            self._proc.stdin.flush()
        launch = ["-m", what["module"]] if "module" in what else [what["script"]]
        return _Child([sys.executable, *launch, *args], pid, ended, out, err)

    def _read(self) -> None:
        for line in self._proc.stdout:
            answer = json.loads(line)
            ident = answer["id"]
            with self._lock:
                if "pid" in answer:
                    self._pids.pop(ident).set_result(answer["pid"])
                elif "exit" in answer:
                    self._exits.pop(ident).set_result(answer["exit"])
                else:
                    self._pids.pop(ident).set_exception(RuntimeError(f"fork server: {answer}"))
                    self._exits.pop(ident).set_exception(RuntimeError(f"fork server: {answer}"))
        with self._lock:  # the server ended: the runs it had will not answer
            for future in [*self._pids.values(), *self._exits.values()]:
                future.set_exception(RuntimeError("the fork server ended"))
            self._pids.clear()
            self._exits.clear()

    def close(self) -> None:
        with contextlib.suppress(BrokenPipeError):  # (it ended already)
            self._proc.stdin.close()  # the server exits at the end of its input
        try:
            self._proc.wait(10)
        except subprocess.TimeoutExpired:  # busy stopping what it still ran: the session is over
            self._proc.kill()
            self._proc.wait()
        shutil.rmtree(self.outputs, ignore_errors=True)


@dataclass
class _Child:
    """A run the fork server was asked for: its pid once forked, its exit, its output files."""

    command: list[str]
    pid: Future
    ended: Future
    out: Path
    err: Path

    def forked(self, timeout: float) -> bool:
        """Whether the server forked it (False: it would not, the caller runs it anew)."""
        try:
            self.pid.result(timeout)
        except RuntimeError:
            return False
        return True

    def kill(self) -> None:
        """Stop it (SIGKILL) unless it has ended."""
        if not self.ended.done():
            with contextlib.suppress(ProcessLookupError):  # it ended meanwhile
                os.kill(self.pid.result(), signal.SIGKILL)

    def wait(self, timeout: float) -> subprocess.CompletedProcess:
        """Its exit and output (the files are removed); killed after `timeout` seconds."""
        try:
            returncode = self.ended.result(timeout)
        except TimeoutError:
            self.kill()
            raise subprocess.TimeoutExpired(self.command, timeout) from None
        proc = subprocess.CompletedProcess(
            self.command, returncode, self.out.read_text(errors="replace"),
            self.err.read_text(errors="replace"),
        )  # fmt: skip
        self.out.unlink()
        self.err.unlink()
        return proc


_server_lock = threading.Lock()
_server: list[_ForkServer | None] = []


def _usable() -> bool:
    return hasattr(os, "fork") and os.environ.get(FORK_SERVER_ENV, "1") != "0"


def _serves_product() -> bool:
    # the shim's `#!` line: one word after the interpreter, 255 bytes in all (Linux)
    return _usable() and " " not in sys.executable and len(sys.executable) < 200


def _fork_server() -> _ForkServer | None:
    """The session's fork server, started at the first run (of a test, or of the product:
    `_ProductRuns`); None where fork is missing or AUTOACCEL_TESTS_FORK_SERVER=0."""
    with _server_lock:
        if not _server:
            _server.append(_ForkServer(_env(), _product_runs) if _usable() else None)
            if _server[0] is not None:
                atexit.register(_server[0].close)
        return _server[0]


class _ProductRuns:
    """The runs the product starts (`autoaccel convert`'s proof and facts, `bench`, `tune`:
    ~190 processes that import torch in a session) are forked by the fork server too: the
    session's environment gets `AUTOACCEL_PYTHON` (autoaccel/run/runner.py) = `shim`, a
    client of the server (zygote_client.py) that falls back on the real interpreter when
    the server would not fork the run. The listening socket is made here, at the start of
    the session; the server gets it when it starts: at the first run of a test, or when a
    client waits (`_watch`: a session that runs nothing starts no server). Until then the
    clients wait in the socket's queue; afterwards only the server holds it, so when it has
    ended a client finds no one listening and falls back."""

    def __init__(self) -> None:
        folder = Path(tempfile.mkdtemp(prefix="autoaccel-zygote-"))
        atexit.register(shutil.rmtree, folder, ignore_errors=True)
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(str(folder / "socket"))
        self.listener.listen(64)
        self.shim = folder / "python"
        client = Path(__file__).resolve().with_name("zygote_client.py")
        self.shim.write_text(
            f"#!{sys.executable} -SEs\nimport sys\nsys.path.append({str(client.parent)!r})\n"
            f"from zygote_client import main\nmain({str(folder / 'socket')!r})\n"
        )
        self.shim.chmod(0o755)
        threading.Thread(target=self._watch, name="fork-server-socket", daemon=True).start()

    def _watch(self) -> None:
        try:
            while not _server:  # no run of a test started the server yet
                if select.select([self.listener], [], [], 1.0)[0]:
                    _fork_server()
        finally:
            self.listener.close()  # the server has its own


def _serve_product() -> _ProductRuns | None:
    try:
        return _ProductRuns() if _serves_product() else None
    except OSError:  # a socket's path is at most 107 bytes: a long TMPDIR
        return None


_product_runs = _serve_product()
if _product_runs is not None:
    # after `SESSION_ENV` was taken: the product's runs started by this process (in-process
    # tests of `run_script`) and by its subprocesses (`autoaccel convert ...`) get it too
    SESSION_ENV["AUTOACCEL_PYTHON"] = os.environ["AUTOACCEL_PYTHON"] = str(_product_runs.shim)


def free_port() -> int:
    """A TCP port of this host that no one listens on (now)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def torchrun_worker_env(rank: int, nproc: int, port: int) -> dict[str, str]:
    """The variables torchrun (torch 2.13: `LocalElasticAgent._start_workers`) sets for local
    rank `rank` of `--standalone --nproc_per_node=NPROC`, all read while the script runs,
    none at start-up; test_running.py compares them with a real torchrun's. Two differ on
    purpose: no agent holds the store (rank 0 does, at MASTER_PORT), and no error file."""
    ranks = {name: str(rank) for name in ("RANK", "LOCAL_RANK", "ROLE_RANK")}
    sizes = {name: str(nproc) for name in ("WORLD_SIZE", "LOCAL_WORLD_SIZE", "ROLE_WORLD_SIZE")}
    return {
        **ranks, **sizes, "GROUP_RANK": "0", "GROUP_WORLD_SIZE": "1", "ROLE_NAME": "default",
        "MASTER_ADDR": "localhost", "MASTER_PORT": str(port), "TORCHELASTIC_RESTART_COUNT": "0",
        "TORCHELASTIC_MAX_RESTARTS": "0", "TORCHELASTIC_RUN_ID": "none",
        "TORCHELASTIC_USE_AGENT_STORE": "False", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
        "TORCHELASTIC_SIGNALS_TO_HANDLE": "SIGTERM,SIGINT,SIGHUP,SIGQUIT",
    }  # fmt: skip


TORCHRUN_WORKER_VARIABLES = frozenset(torchrun_worker_env(0, 1, 0))


def run_ranks(
    script: Path, args: Iterable[str], cwd: Path, nproc: int = 2
) -> subprocess.CompletedProcess:
    """`torchrun --standalone --nproc_per_node=NPROC SCRIPT ARGS` in `cwd` (output captured,
    TIMEOUT_S). Where the fork server may, its NPROC processes are forked from it with the
    environment torchrun gives its workers, and, as torchrun does, the others are stopped when
    one fails: the launcher and NPROC imports of torch (~3.5 CPU-s a run) are saved. The
    ranks' outputs follow each other, rank 0's first."""
    args = [*map(str, args)]
    server, port = _fork_server(), free_port()
    envs = [_env(torchrun_worker_env(rank, nproc, port)) for rank in range(nproc)]
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               f"--nproc_per_node={nproc}", str(script), *args]  # fmt: skip
    if server is None or not server.accepts(
        envs[0], READ_WHILE_RUNNING | TORCHRUN_WORKER_VARIABLES
    ):
        return subprocess.run(
            command, cwd=cwd, env=_env(), capture_output=True, text=True, timeout=TIMEOUT_S
        )
    children = [server.start({"script": str(script)}, args, cwd, env) for env in envs]
    if not all(child.forked(TIMEOUT_S) for child in children):
        raise AssertionError("the fork server would not fork the ranks")
    pending = {child.ended for child in children}
    while pending:
        done, pending = wait(pending, TIMEOUT_S, return_when=FIRST_COMPLETED)
        if not done or any(future.result() != 0 for future in done):
            for child in children:  # timed out, or a rank failed: stop the others
                child.kill()
    procs = [child.wait(TIMEOUT_S) for child in children]
    return subprocess.CompletedProcess(
        command, int(any(proc.returncode != 0 for proc in procs)),  # torchrun exits 1
        "".join(proc.stdout for proc in procs), "".join(proc.stderr for proc in procs),
    )  # fmt: skip


def run_with_losses(script_path, args, tmp_path, env=None, max_steps=None) -> list[float]:
    """Run `script_path args...` under the harness in `tmp_path`; return the recorded losses."""
    return run_under_harness(script_path, args, tmp_path, env, max_steps).losses


def _fixture_path(fixture) -> Path:
    fixture = Path(fixture)
    return fixture if fixture.is_absolute() else FIXTURES_DIR / fixture


def convert(fixture, tmp_path, *options: str) -> Path:
    """`autoaccel convert FIXTURE -o OUT *options --no-verify`; returns OUT (a file in
    `tmp_path`). Unproven: the tests run the conversions they check themselves."""
    fixture = _fixture_path(fixture)
    tag = "".join(o.strip("-") for o in options) or "default"
    out = Path(tmp_path) / f"{fixture.stem}.{tag}.py"
    proc = run_autoaccel("convert", fixture, "-o", out, *options, "--no-verify", cwd=tmp_path)
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

    def _once(
        self, kind: str, script: Path, settings: tuple, make: Callable[[Path], Result]
    ) -> Result:
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
