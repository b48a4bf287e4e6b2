"""The interpreter the product's runs get in the tests (`AUTOACCEL_PYTHON`, see running.py):
a shim, ``#!PYTHON -SEs`` (no site, no PYTHON* variables: it starts in ~15 ms), that calls
`main(SOCKET)`, which asks the fork server (forkserver.py) to run `python ARGS` with this
process's folder, environment, ignored signals, umask and fds 0, 1, 2. Not a shell script:
`sh` would change PWD, and the run must get the environment exactly as it was given.

- Refused (arguments or an environment the server cannot reproduce exactly), or no server:
  `exec PYTHON ARGS`, the run is what it was without the shim.
- Forked: SIGTERM, SIGINT and SIGHUP sent here go to the child (torchrun stops its workers
  with SIGTERM; this pid is the one they know), and this process ends as the child did:
  its exit code, or killed by the same signal. When this process dies (the product's
  timeout SIGKILLs its process group), the server sees the connection close and SIGKILLs
  the child's process group.

What differs from the real interpreter: ~15 ms; `sys.executable` is this shim in a
forked torchrun agent (so its workers come here too); Python's C-locale coercion happens
here even with PYTHONCOERCECLOCALE=0 (under `-E`), setting LC_CTYPE for the run.
"""

import json
import os
import signal
import socket
import sys

# Ignored here (inherited from the caller) means ignored in a fresh interpreter too; Python
# itself ignores SIGPIPE and SIGXFSZ in every process (and the child already does).
PASSED_ON = ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2", "SIGALRM")
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def ask(path: str, ppid: int, argv: list[str]):
    """The server's answers (a file) and the child's pid, or None when it would not fork."""
    try:
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.connect(path)
        umask = os.umask(0o22)
        os.umask(umask)
        ignored = [
            name for name in PASSED_ON if signal.getsignal(getattr(signal, name)) == signal.SIG_IGN
        ]
        request = json.dumps({
            "argv": argv, "cwd": os.getcwd(), "env": dict(os.environ), "ppid": ppid, "umask": umask,
            "ignored": ignored,
        }).encode()  # fmt: skip
        socket.send_fds(conn, [len(request).to_bytes(8, "big") + request], [0, 1, 2])
        answers = conn.makefile("rb")
        answer = answers.readline().split()
    except OSError:  # no server (it ended), a folder gone, ...
        return None
    return (answers, int(answer[1])) if answer[:1] == [b"pid"] else None


def main(path: str) -> None:
    """Run `python ARGS` (this process's arguments), forked by the server at `path`."""
    argv = sys.argv[1:]
    forked = ask(path, os.getppid(), argv)
    if forked is None:
        os.execv(sys.executable, [sys.executable, *argv])
    answers, pid = forked

    def forward(signum, frame):
        try:
            os.kill(pid, signum)
        except ProcessLookupError:  # it ended meanwhile
            pass

    for signum in FORWARDED:
        signal.signal(signum, forward)
    answer = answers.readline().split()
    # no answer: the session ended and the server killed the child
    code = int(answer[1]) if answer[:1] == [b"exit"] else -signal.SIGKILL
    if code < 0:
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
        code = 128 - code  # a signal that does not end a process (SIGCHLD, ...)
    sys.exit(code)
