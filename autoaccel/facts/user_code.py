"""Which frames of a running script are the user's own code: every file outside the
standard library, the installed packages, torch and autoaccel. The harness names the
line that wrote a file with it, the fact recorder the call sites of what it records.

torch is imported when a `UserCode` is made, in the child process only.
"""

from __future__ import annotations

import os
import sysconfig
from types import FrameType


def _library_roots() -> tuple[str, ...]:
    import torch

    paths = sysconfig.get_paths()
    roots = {paths.get(name) for name in ("stdlib", "platstdlib", "purelib", "platlib")}
    roots |= {os.path.dirname(torch.__file__), os.path.dirname(os.path.dirname(os.path.abspath(__file__)))}
    return tuple(sorted(os.path.join(os.path.realpath(r), "") for r in roots if r))


class UserCode:
    """Tells the user's frames from the libraries'; remembers the answer per file."""

    def __init__(self) -> None:
        self._roots = _library_roots()
        self._known: dict[str, bool] = {}

    def owns(self, filename: str) -> bool:
        """Whether code of `filename` (a code object's `co_filename`) is the user's."""
        known = self._known.get(filename)
        if known is None:
            real = os.path.realpath(filename) if not filename.startswith("<") else ""
            known = self._known[filename] = bool(real) and not real.startswith(self._roots)
        return known

    def frame(self, frame: FrameType | None) -> FrameType | None:
        """`frame` or the innermost frame above it that runs the user's code; None if none does."""
        while frame is not None and not self.owns(frame.f_code.co_filename):
            frame = frame.f_back
        return frame
