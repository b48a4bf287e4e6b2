"""Which code of a running script is the user's own: every file outside the standard
library, the installed packages (any `site-packages`/`dist-packages` folder: a child
process may run another interpreter) and autoaccel. The harness names the line that
wrote a file with it, the fact recorder the call sites of what it records, the proof
the line a crash came from.
"""

from __future__ import annotations

import functools
import os
import sysconfig
from pathlib import Path
from types import FrameType

_LIBRARY_ROOTS = tuple(
    os.path.join(os.path.realpath(root), "")
    for root in {
        *map(sysconfig.get_paths().get, ("stdlib", "platstdlib")),
        str(Path(__file__).parents[1]),
    }
    if root
)
_PACKAGE_FOLDERS = frozenset({"site-packages", "dist-packages"})


@functools.lru_cache(maxsize=4096)
def is_user_file(filename: str) -> bool:
    """Whether code of `filename` (a code object's `co_filename`, a traceback's file) is
    the user's; `<frozen runpy>` and `<string>` are not."""
    if filename.startswith("<"):
        return False
    real = os.path.realpath(filename)
    return not real.startswith(_LIBRARY_ROOTS) and _PACKAGE_FOLDERS.isdisjoint(Path(real).parts)


def user_frame(frame: FrameType | None) -> FrameType | None:
    """`frame` or the innermost frame above it that runs the user's code; None if none does."""
    while frame is not None and not is_user_file(frame.f_code.co_filename):
        frame = frame.f_back
    return frame
