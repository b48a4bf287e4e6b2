"""A fork server ("zygote") for the harness runs of the tests: started once per test session
with the environment the runs get, it imports torch and `autoaccel.run.harness` once, then forks
one child per run, which runs `python -m autoaccel.run.harness ARGS` (or `python SCRIPT ARGS`: the
ranks that `running.run_ranks` forks in torchrun's stead, the scripts of `running.run_script`;
or `python -m autoaccel ARGS`: the tests' conversions) as a fresh process would. A run then
skips the ~1.1 s CPU of `import torch` (a conversion, ~0.7 s of imports and first-run caches).
`running.py` starts it and decides which runs may use it.

    python forkserver.py        (the requests on stdin, the answers on stdout; JSON lines)

Request: ``{"id", "module" or "script", "cwd", "env", "argv", "stdout", "stderr"}`` (module:
``autoaccel.run.harness`` or ``autoaccel``; script: a file's path; argv: their arguments;
stdout/stderr: files the run writes).
Answers: ``{"id", "pid"}`` when the child started (``{"id", "error"}`` when the server
would not fork), ``{"id", "exit"}`` when it ended (the exit code, or -N for signal N, as
`subprocess` reports it). The end of stdin ends the server.

What a fresh process sets before the interpreter or torch starts must already be right here:
the server runs with the environment of the runs (PYTHONHASHSEED=0, OMP_NUM_THREADS=1, ...)
and runs no torch operation, so it starts no thread pool and forks single-threaded (checked
before each fork). A run whose environment differs from the server's in anything read at
start (only variables read while the script runs may differ) does not come here.

    python forkserver.py LISTEN_FD SHIM MAY_DIFFER

also serves the runs the *product* starts (`autoaccel convert`'s proof, `bench`, `tune`):
the tests set `AUTOACCEL_PYTHON` to SHIM, whose client (zygote_client.py) connects to the
listening Unix socket LISTEN_FD and sends its arguments, folder, environment and fds 0, 1,
2. The server forks only what it can make exactly as a fresh `python ARGS` would be
(`_refusal`): `[-u] -m MODULE ...` for the modules of `FORKED_MODULES`, an environment that
differs from its own only in the variables MAY_DIFFER (comma-separated; read while the
script runs) and PYTHONPATH and PYTHONUNBUFFERED (the child applies those itself), no module
on the child's path that would hide one imported here. Answers on the connection:
``refused REASON`` (the client then execs the real interpreter), ``pid N``, ``exit CODE``.
A connection that closes before its child ended (the product killed the client) gets the
child's process group SIGKILLed, and those of the runs it started in turn (torchrun's
workers, which torchrun puts in sessions of their own); so do all at the end of stdin.
With AUTOACCEL_TESTS_FORK_LOG=FILE, each request's answer is added to FILE.
"""

from __future__ import annotations

import gc
import io
import json
import os
import runpy
import select
import signal
import socket
import sys
import types
from dataclasses import dataclass

# The modules the product runs (run/runner.py, tune/command.py) and torchrun's workers.
FORKED_MODULES = ("autoaccel.run.harness", "torch.distributed.run", "autoaccel.tune.measure")
# Applied by the child as a fresh interpreter would (`become_command`).
APPLIED = frozenset({"PYTHONPATH", "PYTHONUNBUFFERED"})


def _threads() -> int:
    return len(os.listdir("/proc/self/task"))


@dataclass
class _Run:
    """A child forked for a client: its connection (None once closed) and the run that
    started the client (torchrun's agent for its workers), if any."""

    conn: socket.socket | None
    parent: int | None


def serve(listener: socket.socket | None = None, may_differ: frozenset[str] = frozenset()) -> dict:
    """Answer requests until stdin ends (then exit); in a forked child, return its request."""
    answers = os.fdopen(os.dup(1), "w", buffering=1)
    children: dict[int, str] = {}
    runs: dict[int, _Run] = {}
    start_env = dict(os.environ)
    pending = b""
    while True:
        while children or runs:  # reap the runs that ended
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            ident, run = children.pop(pid, None), runs.pop(pid, None)
            if ident is not None:
                answers.write(
                    json.dumps({"id": ident, "exit": os.waitstatus_to_exitcode(status)}) + "\n"
                )
            if run is not None and run.conn is not None:
                _send(run.conn, f"exit {os.waitstatus_to_exitcode(status)}")
                run.conn.close()
        conns = {run.conn: pid for pid, run in runs.items() if run.conn is not None}
        readable = [0, *([listener] if listener else []), *conns]
        ready, _, _ = select.select(readable, [], [], 0.05 if children or runs else None)
        for conn in set(ready) & conns.keys():  # closed before its child ended: killed
            runs[conns[conn]].conn = None
            conn.close()
            _kill(conns[conn], runs)
        if listener in ready:
            conn, _ = listener.accept()  # a client waits: it does not fail
            request = _receive(conn)
            refusal = _refusal(request, start_env, may_differ) if request else "unreadable"
            if refusal is None and _threads() != 1:
                refusal = "threads"
            if (
                os.environ.get("AUTOACCEL_TESTS_FORK_LOG") and request
            ):  # which runs fork, and why not
                with open(os.environ["AUTOACCEL_TESTS_FORK_LOG"], "a") as log:
                    log.write(f"{refusal or 'forked'}: {' '.join(request['argv'][:3])}\n")
            if refusal is not None:
                _send(conn, f"refused {refusal}")
                conn.close()
            else:
                pid = os.fork()
                if pid == 0:
                    answers.close()
                    listener.close()
                    for other in conns:
                        other.close()
                    conn.close()
                    return request
                parent = request["ppid"] if request["ppid"] in runs else None
                runs[pid] = _Run(conn, parent)
                _send(conn, f"pid {pid}")
            for fd in request.get("fds", []) if request else []:
                os.close(fd)
        if 0 not in ready:
            continue
        chunk = os.read(0, 1 << 16)
        if not chunk:
            for pid in runs:  # the test session ended: no run of the product outlives it
                _killpg(pid)
            os._exit(0)  # the test session ended; the tests' runs still going end on their own
        pending += chunk
        while b"\n" in pending:
            line, pending = pending.split(b"\n", 1)
            request = json.loads(line)
            if _threads() != 1:  # forking a threaded process could deadlock the child
                answers.write(json.dumps({"id": request["id"], "error": "threads"}) + "\n")
                continue
            pid = os.fork()
            if pid == 0:
                answers.close()
                if listener:
                    listener.close()
                for conn in conns:
                    conn.close()
                return request
            children[pid] = request["id"]
            answers.write(json.dumps({"id": request["id"], "pid": pid}) + "\n")


def _send(conn: socket.socket, line: str) -> None:
    try:
        conn.sendall(line.encode() + b"\n")
    except OSError:  # the client is gone: its connection reads as closed next
        pass


def _killpg(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):  # the group is gone
        pass


def _kill(pid: int, runs: dict[int, _Run]) -> None:
    """SIGKILL the process group of run `pid` and of the runs it started, theirs in turn."""
    _killpg(pid)
    for child, run in runs.items():
        if run.parent == pid:
            _kill(child, runs)


def _receive(conn: socket.socket) -> dict | None:
    """A client's request (length, JSON) and its fds 0, 1, 2 (as "fds"); None if unreadable."""
    conn.settimeout(10)  # the client sends it at once; a stuck one must not stop the server
    fds: list[int] = []
    try:
        data, fds, _, _ = socket.recv_fds(conn, 1 << 16, 3)
        while len(data) < 8 or len(data) < 8 + int.from_bytes(data[:8], "big"):
            more = conn.recv(1 << 16)
            if not more:
                raise EOFError
            data += more
        request = json.loads(data[8:])
    except (OSError, EOFError, ValueError):
        request = None
    conn.settimeout(None)
    if request is None or len(fds) != 3:
        for fd in fds:
            os.close(fd)
        return None
    return {**request, "fds": fds}


def _refusal(request: dict, start_env: dict[str, str], may_differ: frozenset[str]) -> str | None:
    """Why this server cannot run `python ARGV` as a fresh interpreter would (None: it can)."""
    argv, env = request["argv"], request["env"]
    options = argv[: argv.index("-m")] if "-m" in argv else None
    if (
        options not in ([], ["-u"])
        or argv[len(options) + 1 : len(options) + 2] == []
        or (argv[len(options) + 1] not in FORKED_MODULES)
    ):
        return "arguments"
    differ = {k for k in env.keys() | start_env.keys() if env.get(k) != start_env.get(k)}
    if "PYTHONPATH" in start_env and "PYTHONPATH" in differ:  # `become_command` builds on ours
        return "environment: PYTHONPATH"
    if differ - may_differ - APPLIED:
        return "environment: " + ",".join(sorted(differ - may_differ - APPLIED))
    # A module on the child's path named as one imported here from elsewhere would be found
    # by a fresh interpreter (its path is searched first), not here.
    imported = {
        name: getattr(mod, "__file__", None) for name, mod in sys.modules.items() if "." not in name
    }
    hidden = set()
    for folder in _path_before_stdlib(request["cwd"], env):
        try:
            entries = os.listdir(folder)
        except OSError:
            continue
        for entry in entries:
            name, path = entry.split(".")[0], os.path.join(folder, entry)
            if os.path.isdir(
                path
            ):  # a folder without `__init__.py` is found only where nothing else is
                path = os.path.join(path, "__init__.py")
            elif not entry.endswith((".py", ".pyc", ".so")):
                continue
            if name in imported and os.path.isfile(path) and not _same(path, imported[name]):
                hidden.add(name)
    return f"would hide {sorted(hidden)}" if hidden else None


def _same(path: str, other: str | None) -> bool:
    return other is not None and os.path.realpath(path) == os.path.realpath(other)


def _path_before_stdlib(cwd: str, env: dict[str, str]) -> list[str]:
    """What `python -m` puts before the standard library on `sys.path`: the working folder,
    then PYTHONPATH's entries made absolute (an empty one is the working folder)."""
    entries = env.get("PYTHONPATH", "").split(os.pathsep) if env.get("PYTHONPATH") else []
    return [cwd, *(os.path.abspath(os.path.join(cwd, entry)) for entry in entries)]


def become(request: dict) -> list[str]:
    """Make this forked child look like `python -m MODULE` (or `python SCRIPT`) started in
    the request's folder with its environment; return the arguments."""
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
        out = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(out, fd)
        os.close(out)
    script = request.get("script")
    # `python -m` puts the working folder first on the path (here: this file's folder),
    # `python SCRIPT` the script's folder
    sys.path[0] = os.path.dirname(os.path.abspath(script)) if script else os.getcwd()
    sys.argv = [script or harness.__file__, *request["argv"]]
    # `random` reseeds itself in a forked child; NumPy's and torch's global generators do
    # not (a fresh process seeds them from the OS)
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()
    if "torch" in sys.modules:
        sys.modules["torch"].seed()
    return request["argv"]


def become_command(request: dict, shim: str) -> str:
    """Make this forked child what `python ARGV` started by the client would be when it
    starts running MODULE: fds, folder, environment, signals, process group, streams,
    `sys.path`, `sys.argv`; return MODULE."""
    for target, fd in enumerate(request["fds"]):
        os.dup2(fd, target)
    for fd in set(request["fds"]) - {0, 1, 2}:
        os.close(fd)
    os.setpgid(0, 0)  # the server kills this group when the client dies
    os.chdir(request["cwd"])
    os.umask(request["umask"])
    env, argv = request["env"], request["argv"]
    os.environ.clear()
    os.environ.update(env)
    for name in ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2", "SIGALRM"):
        default = signal.default_int_handler if name == "SIGINT" else signal.SIG_DFL
        signal.signal(
            getattr(signal, name), signal.SIG_IGN if name in request["ignored"] else default
        )
    _streams(unbuffered="-u" in argv[: argv.index("-m")] or bool(env.get("PYTHONUNBUFFERED")))
    # `python -m`: the working folder, then PYTHONPATH's entries, then the rest as here
    # (the server's first entry is its own folder; it has no PYTHONPATH, or this one)
    cwd = os.getcwd()
    sys.path[:] = [cwd, *dict.fromkeys([*_path_before_stdlib(cwd, env)[1:], *sys.path[1:]])]
    module = argv[argv.index("-m") + 1]
    sys.argv = ["-m", *argv[argv.index("-m") + 2 :]]
    sys.orig_argv = [sys.executable, *argv]
    if module in sys.modules:  # imported here (the harness), not yet in a fresh interpreter
        del sys.modules[module]
        package, _, name = module.rpartition(".")
        vars(sys.modules[package]).pop(name, None)
    if module == "torch.distributed.run":
        sys.executable = shim  # its workers start through the shim, and are forked too
    if "numpy" in sys.modules:  # as in `become`
        sys.modules["numpy"].random.seed()
    if "torch" in sys.modules:
        sys.modules["torch"].seed()
    return module


def _streams(unbuffered: bool) -> None:
    """New `sys.stdin`, `stdout`, `stderr` on fds 0, 1, 2, made as Python makes them at
    start (CPython's `create_stdio`): line-buffered on a terminal (stderr always), unbuffered
    and written through with `-u`; encodings as here (the same environment and locale)."""
    for fd, name in enumerate(("stdin", "stdout", "stderr")):
        old = getattr(sys, name)
        writing = fd > 0
        bare = unbuffered and writing
        raw = open(
            fd, "wb" if writing else "rb", buffering=0 if bare else -1, closefd=False
        )  # noqa: SIM115
        (raw if bare else raw.raw).name = f"<{name}>"
        stream = io.TextIOWrapper(
            raw, old.encoding, old.errors, newline="\n",
            line_buffering=not unbuffered and (fd == 2 or os.isatty(fd)), write_through=unbuffered,
        )  # fmt: skip
        stream.mode = "w" if writing else "r"
        setattr(sys, name, stream)
        setattr(sys, f"__{name}__", stream)


def run_module(module: str) -> None:
    """Run MODULE as `python -m` does (`runpy._run_module_as_main`, in a new `__main__`),
    then exit as it would: an uncaught exception's traceback starts where a fresh
    interpreter's does, then exit code 1 (KeyboardInterrupt: killed by SIGINT)."""
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        runpy._run_module_as_main(module)
    except SystemExit:
        raise
    except BaseException as error:  # noqa: BLE001 - as the interpreter reports it
        sys.excepthook(type(error), error, error.__traceback__.tb_next)
        if isinstance(error, KeyboardInterrupt):
            sys.stdout.flush()
            sys.stderr.flush()
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGINT)
        sys.exit(1)
    sys.exit(0)


if __name__ == "__main__":
    # the imports every run would pay: torch, and what the harness patches
    environment = dict(os.environ)
    import torch
    import torch._dynamo  # noqa: F401  (the first `backward()` imports it: ~1.5 CPU-s a run)
    import torch.distributed
    import torch.nn.parallel
    import torch.utils.data  # noqa: F401

    import autoaccel.cli  # noqa: F401
    from autoaccel.run import harness

    # `python -m autoaccel` (the tests' `convert`, `lint --fix`, ...): its first conversion
    # imports LibCST and the transforms and fills their caches (~0.6 CPU-s), done once here
    from autoaccel.convert.log import ConvertOptions
    from autoaccel.convert.pipeline import convert_source

    warm_up = os.path.join(os.path.dirname(__file__), "..", "fixtures", "linear_exact.py")
    with open(warm_up, encoding="utf-8") as source:
        convert_source(source.read(), ConvertOptions(target="ddp", amp="off"))

    # torch._dynamo's import sets TORCHINDUCTOR_CACHE_DIR, as it does in a fresh run once
    # that imports it: the environment the runs are compared with is the one before
    for name in os.environ.keys() - environment.keys():
        del os.environ[name]

    # What was imported lives as long as the children: out of the cyclic collector's sight,
    # a child's collections do not walk it (nor copy the pages it touches on the way).
    gc.freeze()
    listener, shim, may_differ = None, "", frozenset()
    if len(sys.argv) > 1:  # LISTEN_FD SHIM MAY_DIFFER
        listener = socket.socket(fileno=int(sys.argv[1]))
        shim, may_differ = sys.argv[2], frozenset(filter(None, sys.argv[3].split(",")))
    request = serve(listener, may_differ)
    if "fds" in request:
        run_module(become_command(request, shim))
    argv = become(request)
    if "script" in request:
        runpy.run_path(request["script"], run_name="__main__")
        sys.exit(0)
    if request["module"] == "autoaccel":
        run_module("autoaccel")
    assert request["module"] == "autoaccel.run.harness", request["module"]
    sys.exit(harness.main(argv))
