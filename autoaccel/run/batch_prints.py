"""Fingerprints of the data each of a run's first training steps fed its models.

For batches that no DataLoader hands out (no sample indices to compare), the proof tells
which data a step trained on by its content: each tensor that a top-level forward of a
module with trainable parameters received (positional arguments, and those in a list,
tuple or dict among them) and that needs no gradient, hashed with its dtype and shape.
Hashes are stable across processes (blake2b, not Python's randomised `hash`). Only the
first `STEPS` steps are fingerprinted: then the hooks are removed, and the rest of the run
pays nothing for them.

torch is imported only inside functions, so importing this module stays cheap.
"""

from __future__ import annotations

import hashlib
from typing import Any

STEPS = 8  # steps fingerprinted: enough for the original's first rounds of batches


class BatchPrints:
    """Global forward hooks that fingerprint what the top-level forwards of trainable
    modules receive; `step()` closes a step's set, `prints` has one list per step."""

    def __init__(self) -> None:
        from torch.nn.modules.module import (
            register_module_forward_hook,
            register_module_forward_pre_hook,
        )

        self.prints: list[list[str]] = []
        self._current: set[str] = set()
        self._depth = 0
        self._handles = [
            register_module_forward_pre_hook(self._entered),
            register_module_forward_hook(self._left, always_call=True),
        ]

    def step(self) -> None:
        """A training step ended: what its forwards received is one entry of `prints`."""
        if not self._handles:
            return
        self.prints.append(sorted(self._current))
        self._current = set()
        if len(self.prints) >= STEPS:
            self.close()

    def close(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def _entered(self, module: Any, args: tuple) -> None:
        self._depth += 1
        if self._depth == 1 and any(p.requires_grad for p in module.parameters()):
            for value in args:
                self._current.update(_fingerprints(value))

    def _left(self, module: Any, args: tuple, output: Any) -> None:
        self._depth = max(0, self._depth - 1)


def _fingerprints(value: Any, nested: bool = False) -> list[str]:
    """The hashes of the tensors in `value` that need no gradient (one level into lists,
    tuples and dicts)."""
    import torch

    if isinstance(value, torch.Tensor):
        if value.requires_grad or not value.numel():
            return []
        data = value.detach().to("cpu", copy=True).contiguous().reshape(-1)
        digest = hashlib.blake2b(data.view(torch.uint8).numpy().tobytes(), digest_size=8)
        digest.update(f"{value.dtype}{tuple(value.shape)}".encode())
        return [digest.hexdigest()]
    if nested:
        return []
    items = value.values() if isinstance(value, dict) else value
    if isinstance(items, (list, tuple)) or isinstance(value, dict):
        return [found for item in items for found in _fingerprints(item, nested=True)]
    return []
