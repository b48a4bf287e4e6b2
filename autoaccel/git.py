"""git, run in a folder autoaccel scans (a folder given to `lint`, a pull request's
checkout), without running what that repository's own `.git/config` names.

Settings given with `-c` win over the repository's. `core.fsmonitor` is a command that
`ls-files` runs to learn what changed; in a partial clone a missing object is fetched,
through a transport the repository configures (`core.sshCommand`), so fetching is off.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

_SAFE_SETTINGS = ("core.fsmonitor=false", "protocol.allow=never")
_SAFE_ENVIRONMENT = {"GIT_NO_LAZY_FETCH": "1", "GIT_TERMINAL_PROMPT": "0"}


def git(*args: str, cwd: Path, timeout: float | None = None) -> subprocess.CompletedProcess[str]:
    """Run `git args` in `cwd`; the result holds stdout and stderr as text, decoded as
    file names are (`os.fsdecode`) and without `text=True`'s newline translation, which
    would make a `\\r` in a file name a `\\n`."""
    settings = [word for setting in _SAFE_SETTINGS for word in ("-c", setting)]
    run = subprocess.run(
        ["git", *settings, *args],
        cwd=cwd,
        capture_output=True,
        timeout=timeout,
        env={**os.environ, **_SAFE_ENVIRONMENT},
    )
    return subprocess.CompletedProcess(
        run.args, run.returncode, os.fsdecode(run.stdout), os.fsdecode(run.stderr)
    )
