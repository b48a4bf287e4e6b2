"""Run a training script unchanged and record the loss of every backward call.

    python -m autoaccel.harness --losses-out PATH [--max-steps N] SCRIPT [script args...]

The script runs as ``__main__`` in this process (``runpy``), with ``torch.Tensor.backward``
patched to record each scalar loss and a timestamp. Under ``torch.amp.GradScaler`` the
recorded value is the *unscaled* loss: ``GradScaler.scale`` marks the tensor it returns
with the scale it applied, and the backward record divides it back out. ``--max-steps N``
stops the script after N recorded backward calls. The record is written as JSON on every
exit path; ``{rank}`` in PATH is replaced by ``$RANK`` (for torchrun).

torch is imported only inside functions, so importing this module stays cheap.
"""

from __future__ import annotations

import argparse
import json
import os
import runpy
import sys
import time
from contextlib import contextmanager
from pathlib import Path

# Attribute set on tensors returned by GradScaler.scale: the scale factor they carry.
_SCALE_ATTR = "_autoaccel_loss_scale"


class _MaxStepsReached(Exception):
    """Raised from inside backward() once --max-steps losses have been recorded."""


@contextmanager
def _patched_torch(record: dict, max_steps: int | None):
    import torch

    original_backward = torch.Tensor.backward
    original_scale = torch.amp.GradScaler.scale

    def backward(self, *args, **kwargs):
        if self.dim() == 0 or self.numel() == 1:
            value = float(self.detach().float())
            scale = getattr(self, _SCALE_ATTR, None)
            if scale is not None:
                value /= scale
            record["losses"].append(value)
            record["times"].append(time.perf_counter())
        result = original_backward(self, *args, **kwargs)
        if max_steps is not None and len(record["losses"]) >= max_steps:
            raise _MaxStepsReached
        return result

    def scale(self, outputs):
        scaled = original_scale(self, outputs)
        if isinstance(scaled, torch.Tensor) and self.is_enabled():
            setattr(scaled, _SCALE_ATTR, float(self.get_scale()))
        return scaled

    torch.Tensor.backward = backward
    torch.amp.GradScaler.scale = scale
    try:
        yield
    finally:
        torch.Tensor.backward = original_backward
        torch.amp.GradScaler.scale = original_scale


def record_losses(script: str, args: list[str], max_steps: int | None = None) -> dict:
    """Run `script` as `__main__` with `args` and return the recorded losses.

    Returns ``{"losses", "times", "rank", "exit"}``; ``exit`` is ``"ok"``, ``"max-steps"``
    or ``"error: <exception>"`` (a script that calls ``sys.exit(0)`` counts as ``"ok"``).
    """
    record = {"losses": [], "times": [], "rank": int(os.environ.get("RANK", 0)), "exit": "ok"}
    script_dir = str(Path(script).resolve().parent)
    saved_argv, saved_path = sys.argv[:], sys.path[:]
    sys.argv = [script, *args]
    sys.path.insert(0, script_dir)
    try:
        with _patched_torch(record, max_steps):
            runpy.run_path(script, run_name="__main__")
    except _MaxStepsReached:
        record["exit"] = "max-steps"
    except SystemExit as exc:
        if exc.code not in (None, 0):
            record["exit"] = f"error: SystemExit({exc.code!r})"
    except BaseException as exc:  # noqa: BLE001 - every failure is reported in the record
        record["exit"] = f"error: {type(exc).__name__}: {exc}"
        import traceback

        traceback.print_exc()
    finally:
        sys.argv, sys.path[:] = saved_argv, saved_path
    return record


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m autoaccel.harness", description=__doc__.split("\n")[0])
    parser.add_argument("--losses-out", required=True, help="JSON output path; {rank} is replaced")
    parser.add_argument("--max-steps", type=int, default=None, help="stop after N backward calls")
    parser.add_argument("script")
    parser.add_argument("args", nargs=argparse.REMAINDER)
    ns = parser.parse_args(argv)
    record = record_losses(ns.script, ns.args, ns.max_steps)
    out = Path(ns.losses_out.replace("{rank}", str(record["rank"])))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record))
    return 1 if record["exit"].startswith("error") else 0


if __name__ == "__main__":
    sys.exit(main())
