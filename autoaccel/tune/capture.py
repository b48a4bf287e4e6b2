"""Run a training script only until its DataLoaders exist, and keep them.

Every `DataLoader(...)` the script constructs is recorded with the arguments it was given
and the position of the call in the script. When the script first iterates a loader (or
calls `backward()` without one) the recorded loaders are handed to a callback, still inside
the running script, so that its classes stay importable as `__main__` (worker processes
pickle datasets by that name); then the script is stopped.
"""

from __future__ import annotations

import inspect
import os
import sys
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any
from collections.abc import Callable

from autoaccel.patching import patched
from autoaccel.run.harness import StopScript, run_as_main

# DataLoader arguments that only make sense with worker processes.
_WORKER_ONLY = ("persistent_workers", "prefetch_factor", "multiprocessing_context", "timeout")
_TUNED = ("num_workers", "pin_memory", "persistent_workers", "prefetch_factor")


@dataclass
class CapturedLoader:
    loader: Any  # the script's DataLoader
    arguments: dict[str, Any]  # what the script passed to DataLoader.__init__, by name
    line: int | None  # where the call is in the script (1-based line, 0-based column)
    column: int | None

    @property
    def key(self) -> str:
        return f"{self.line}:{self.column}"

    def arguments_with(self, keywords: dict[str, object]) -> dict[str, Any]:
        """The script's arguments with the tuned ones replaced by `keywords`."""
        dropped = _TUNED + (_WORKER_ONLY if not keywords.get("num_workers") else ())
        kept = {name: value for name, value in self.arguments.items() if name not in dropped}
        return {**kept, **keywords}


class _Capture:
    def __init__(self, script: str, on_ready: Callable[[list[CapturedLoader]], None]) -> None:
        self.script = os.path.realpath(script)
        self.on_ready = on_ready
        self.loaders: list[CapturedLoader] = []
        self.active = True

    def patches(self) -> ExitStack:
        import torch
        from torch.utils.data import DataLoader

        stack = ExitStack()
        stack.enter_context(patched(DataLoader, "__init__", self._init))
        stack.enter_context(patched(DataLoader, "__iter__", self._stop_before))
        stack.enter_context(patched(torch.Tensor, "backward", self._stop_before))
        return stack

    def _init(self, original: Callable) -> Callable:
        signature = inspect.signature(original)

        def __init__(loader, *args, **kwargs):
            original(loader, *args, **kwargs)
            if self.active:
                arguments = signature.bind(loader, *args, **kwargs).arguments
                arguments.pop(next(iter(signature.parameters)))  # self
                self.loaders.append(CapturedLoader(loader, dict(arguments), *self._call_site()))

        return __init__

    def _call_site(self) -> tuple[int | None, int | None]:
        """Line and column of the innermost call in the script on the stack."""
        frame = sys._getframe(2)
        while frame is not None and os.path.realpath(frame.f_code.co_filename) != self.script:
            frame = frame.f_back
        if frame is None:
            return None, None
        positions = getattr(frame.f_code, "co_positions", None)  # Python 3.11+
        if positions is None:
            return frame.f_lineno, None
        line, _, column, _ = list(positions())[frame.f_lasti // 2]
        return line, column

    def _stop_before(self, original: Callable) -> Callable:
        def first_use(obj, *args, **kwargs):
            if not self.active:
                return original(obj, *args, **kwargs)
            self.hand_over()
            raise StopScript

        return first_use

    def hand_over(self) -> None:
        if self.active:
            self.active = False
            self.on_ready(self.loaders)


def capture_loaders(
    script: str, args: list[str], on_ready: Callable[[list[CapturedLoader]], None]
) -> str:
    """Run `script` until its loaders exist and call `on_ready` with them (also when the
    script ends first). Returns how the script ended, as `harness.run_as_main` does."""
    capture = _Capture(script, on_ready)
    exit_status = run_as_main(script, args, capture.patches())
    if exit_status == "max-steps":
        return "ok"
    if not exit_status.startswith("error"):
        capture.hand_over()
    return exit_status
