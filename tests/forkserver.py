"""A fork server ("zygote") for the harness runs of the tests: started once per test session
with the environment the runs get, it imports torch and `autoaccel.harness` once, then forks
one child per run, which runs `python -m autoaccel.harness ARGS` (or `python SCRIPT ARGS`: the
ranks that `running.run_ranks` forks in torchrun's stead) as a fresh process would. A run
then skips the ~1.1 s CPU of `import torch`. `running.py` starts it and decides which runs
may use it.

    python forkserver.py        (the requests on stdin, the answers on stdout; JSON lines)

Request: ``{"id", "module" or "script", "cwd", "env", "argv", "stdout", "stderr"}`` (module:
``autoaccel.harness``; script: a file's path; argv: their arguments; stdout/stderr: files
the run writes).
Answers: ``{"id", "pid"}`` when the child started (``{"id", "error"}`` when the server
would not fork), ``{"id", "exit"}`` when it ended (the exit code, or -N for signal N, as
`subprocess` reports it). The end of stdin ends the server.

What a fresh process sets before the interpreter or torch starts must already be right here:
the server runs with the environment of the runs (PYTHONHASHSEED=0, OMP_NUM_THREADS=1, ...)
and runs no torch operation, so it starts no thread pool and forks single-threaded (checked
before each fork). A run whose environment differs from the server's in anything read at
start (only variables read while the script runs may differ) does not come here.
"""

from __future__ import annotations

import gc
import json
import os
import runpy
import select
import sys


def _threads() -> int:
    return len(os.listdir("/proc/self/task"))


def serve() -> dict:
    """Answer requests until stdin ends (then exit); in a forked child, return its request."""
    answers = os.fdopen(os.dup(1), "w", buffering=1)
    children: dict[int, str] = {}
    pending = b""
    while True:
        while children:  # reap the runs that ended
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            ident = children.pop(pid, None)
            if ident is not None:
                answers.write(json.dumps({"id": ident, "exit": os.waitstatus_to_exitcode(status)}) + "\n")
        ready, _, _ = select.select([0], [], [], 0.05 if children else None)
        if not ready:
            continue
        chunk = os.read(0, 1 << 16)
        if not chunk:
            os._exit(0)  # the test session ended; runs still going end on their own
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
                return request
            children[pid] = request["id"]
            answers.write(json.dumps({"id": request["id"], "pid": pid}) + "\n")


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
    # `random` reseeds itself in a forked child; NumPy's global generator does not (a fresh
    # process seeds it from the OS)
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()
    return request["argv"]


if __name__ == "__main__":
    # the imports every run would pay: torch, and what the harness patches
    import torch
    import torch.distributed
    import torch.nn.parallel
    import torch.utils.data  # noqa: F401

    from autoaccel import harness

    # What was imported lives as long as the children: out of the cyclic collector's sight,
    # a child's collections do not walk it (nor copy the pages it touches on the way).
    gc.freeze()
    request = serve()
    argv = become(request)
    if "script" in request:
        runpy.run_path(request["script"], run_name="__main__")
        sys.exit(0)
    assert request["module"] == "autoaccel.harness", request["module"]
    sys.exit(harness.main(argv))
