"""The measuring side of `autoaccel tune`, run in its own process:

    python -m autoaccel.tune.measure --events PATH [--batches N] [--repeats R]
                                     [--max-workers W] [--heuristic-workers H]
                                     SCRIPT [script args...]

Runs SCRIPT until its DataLoaders exist (`capture.py`), then times each loader under the
settings `sweep.py` proposes. Each setting's loader is iterated `repeats + 1` times; the
first pass is warm-up and is dropped. A pass times the first batch (worker start-up) and up
to N further batches (the steady rate), and with CUDA includes the copy of each batch to the
GPU. A pass's score is batches/s over one of the script's epochs: its first batch plus the
epoch's other batches at its steady rate; a setting's score is the median of its passes', and
its spread their range. With `--heuristic-workers H`, a loader without workers is also
measured with the H workers (and `persistent_workers=True`) that `autoaccel convert` would
give it. Progress and the result go to PATH as JSON
lines: `{"type": "plan", ...}`, `{"type": "measured", ...}`, `{"type": "result", ...}`.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from autoaccel.tune.capture import CapturedLoader, capture_loaders
from autoaccel.tune.sweep import LoaderSetting, Measurement, planned_count, sweep


class _Events:
    def __init__(self, path: Path) -> None:
        self.path = path

    def emit(self, kind: str, **fields: Any) -> None:
        with self.path.open("a", encoding="utf-8") as stream:
            stream.write(json.dumps({"type": kind, **fields}) + "\n")


def cpu_count() -> int:
    """CPUs this process may run on."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def picklable_error(captured: CapturedLoader) -> str | None:
    """Why worker processes could not receive the dataset, or None when they can.

    Tensors are skipped (not copied) while checking: they always pickle, and a large data
    set would otherwise be serialised in full just to learn that.
    """
    import torch

    class _SkipTensors(pickle.Pickler):
        def persistent_id(self, obj: Any) -> Any:
            return id(obj) if isinstance(obj, torch.Tensor) else None

    class _Discard:
        def write(self, data: bytes) -> int:
            return len(data)

    loader = captured.loader
    try:
        _SkipTensors(_Discard()).dump((loader.dataset, loader.collate_fn, loader.worker_init_fn))
    except Exception as error:  # noqa: BLE001 - any pickling failure means "no workers"
        return f"{type(error).__name__}: {error}"
    return None


def current_setting(loader: Any) -> LoaderSetting:
    prefetch = loader.prefetch_factor if loader.num_workers else None
    return LoaderSetting(
        num_workers=loader.num_workers,
        pin_memory=bool(loader.pin_memory),
        persistent_workers=bool(loader.persistent_workers),
        prefetch_factor=None if prefetch == 2 else prefetch,  # 2 is the default
    ).normalised()


class _Timer:
    """Times loaders built from one captured loader's arguments."""

    def __init__(self, captured: CapturedLoader, batches: int, repeats: int) -> None:
        import torch

        self.captured = captured
        self.batches = batches
        self.repeats = repeats
        self.cuda = torch.cuda.is_available()
        try:
            self.epoch = len(captured.loader)
        except TypeError:  # an IterableDataset without __len__
            self.epoch = batches + 1

    def measure(self, setting: LoaderSetting) -> Measurement:
        from torch.utils.data import DataLoader

        try:
            loader = DataLoader(**self.captured.arguments_with(setting.keywords()))
            passes = [self._one_pass(loader, setting.pin_memory) for _ in range(self.repeats + 1)]
        except Exception as error:  # noqa: BLE001 - a setting that fails is reported, not fatal
            return Measurement(setting, error=f"{type(error).__name__}: {error}")
        timed = passes[1:]
        scores = [self._score(first, rate) for first, rate in timed]
        first = statistics.median(first for first, _ in timed)
        spread = (min(scores), max(scores))
        return Measurement(setting, statistics.median(scores), first, batches_per_s_range=spread)

    def _score(self, first: float, rate: float | None) -> float:
        """Batches/s over one epoch: the first batch, then the others at `rate`."""
        if rate is None or self.epoch <= 1:
            return 1.0 / first
        return self.epoch / (first + (self.epoch - 1) / rate)

    def _one_pass(self, loader: Any, non_blocking: bool) -> tuple[float, float | None]:
        """(seconds to the first batch, batches/s after it) for one iterator."""
        start = time.perf_counter()
        first_done = start
        count = 0
        iterator = iter(loader)
        for batch in iterator:
            self._deliver(batch, non_blocking)
            count += 1
            if count == 1:
                first_done = time.perf_counter()
            if count > self.batches:
                break
        if self.cuda:
            import torch

            torch.cuda.synchronize()
        end = time.perf_counter()
        del iterator  # shuts non-persistent workers down
        return first_done - start, (count - 1) / (end - first_done) if count > 1 else None

    def _deliver(self, batch: Any, non_blocking: bool) -> None:
        if not self.cuda:
            return
        import torch

        if isinstance(batch, torch.Tensor):
            batch.to("cuda", non_blocking=non_blocking)
        elif isinstance(batch, dict):
            self._deliver(list(batch.values()), non_blocking)
        elif isinstance(batch, (list, tuple)):
            for item in batch:
                self._deliver(item, non_blocking)


def _describe(captured: CapturedLoader, same_site: int, setting: LoaderSetting) -> dict[str, Any]:
    loader = captured.loader
    return {
        "key": captured.key,
        "line": captured.line,
        "column": captured.column,
        "dataset": type(loader.dataset).__name__,
        "batch_size": loader.batch_size,
        "same_site": same_site,  # loaders built by this call (the first one is tuned)
        "current": setting.as_dict(),
    }


def tune_loaders(
    loaders: list[CapturedLoader],
    events: _Events,
    batches: int,
    repeats: int,
    limit: int,
    heuristic_workers: int | None = None,
) -> None:
    """Sweep every call site's first loader and emit the result; a loader without workers
    is also measured with `heuristic_workers` (and persistent workers)."""
    import torch

    cuda = torch.cuda.is_available()
    sites: dict[str, list[CapturedLoader]] = {}
    for captured in loaders:
        sites.setdefault(captured.key, []).append(captured)
    plans = []
    for group in sites.values():
        captured = group[0]
        error = picklable_error(captured)
        current = current_setting(captured.loader)
        plan = _describe(captured, len(group), current)
        plan["unpicklable"] = error
        heuristic = None
        if heuristic_workers and error is None and current.num_workers == 0:
            heuristic = replace(current, num_workers=heuristic_workers, persistent_workers=True)
        plan["heuristic"] = heuristic.as_dict() if heuristic else None
        plan["planned"] = planned_count(limit, error is None, cuda, heuristic is not None)
        plans.append((captured, plan))
    events.emit("plan", loaders=[plan for _, plan in plans], cuda=cuda, cpu_count=limit)
    results = []
    for captured, plan in plans:
        timer = _Timer(captured, batches, repeats)
        plan["batches_per_epoch"] = timer.epoch

        def measure(setting: LoaderSetting, key: str = plan["key"]) -> Measurement:
            result = timer.measure(setting)
            events.emit("measured", key=key, measurement=result.as_dict())
            return result

        current = LoaderSetting(**plan["current"])
        heuristic = LoaderSetting(**plan["heuristic"]) if plan["heuristic"] else None
        measured, best = sweep(
            current, measure, limit, plan["unpicklable"] is None, cuda, reference=heuristic
        )
        results.append(
            {
                **plan,
                "results": [m.as_dict() for m in measured],
                "best": best.as_dict(),
            }
        )
    events.emit("result", loaders=results, cuda=cuda, cpu_count=limit)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m autoaccel.tune.measure")
    parser.add_argument("--events", required=True, type=Path)
    parser.add_argument("--batches", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-workers", type=int, default=None)
    parser.add_argument("--heuristic-workers", type=int, default=None)
    parser.add_argument("script")
    parser.add_argument("args", nargs=argparse.REMAINDER)
    ns = parser.parse_args(argv)
    events = _Events(ns.events)
    limit = min(cpu_count(), ns.max_workers if ns.max_workers is not None else cpu_count())

    def on_ready(loaders: list[CapturedLoader]) -> None:
        tune_loaders(loaders, events, ns.batches, ns.repeats, limit, ns.heuristic_workers)

    exit_status = capture_loaders(ns.script, ns.args, on_ready)
    if exit_status.startswith("error"):
        events.emit("error", message=exit_status)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
