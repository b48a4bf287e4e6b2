"""Numbers from two harness records: throughput, peak memory and how well the loss
curves agree."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from autoaccel.convert.log import ConvertOptions

# Loss agreement tolerated by default: the largest relative difference of any common step.
# Without AMP the converted script must compute the same numbers up to float rounding (the
# fixtures agree exactly over 16 steps on CPU); reordered arithmetic (torch.compile's fused
# kernels, channels_last convolutions) adds a little. Under AMP every step's rounding
# (bf16: 8 bits of mantissa, ~0.4 % per op) moves the weights a little, and training
# amplifies it: over 16 CPU steps the fixtures differ by up to 10.9 % (mnist_main, Adadelta
# at lr 1.0) and 6.9 % (resnet_cifar). fp16 keeps 11 bits; its number is not measured yet.
EXACT = 1e-4
REORDERED = 1e-2
AMP = {"off": 0.0, "bf16": 0.15, "fp16": 0.10}
# DDP shards every batch differently from the original's sampler, so single steps are not
# comparable: the curves are compared as moving averages over this share of the steps.
DDP_WINDOW = 0.2
DDP = 0.1


@dataclass(frozen=True)
class Throughput:
    steps: int  # measured steps (warm-up excluded)
    seconds: float
    samples: int | None  # None when no DataLoader batch was seen

    @property
    def steps_per_s(self) -> float:
        return self.steps / self.seconds

    @property
    def samples_per_s(self) -> float | None:
        return self.samples / self.seconds if self.samples else None


def default_tolerance(options: ConvertOptions) -> float:
    """The loss agreement to expect from a conversion with `options`."""
    if options.target == "ddp":
        return max(DDP, AMP[options.amp])
    tolerance = AMP[options.amp] or EXACT
    if options.compile or options.channels_last:
        tolerance = max(tolerance, REORDERED)
    return tolerance


def smoothing_window(options: ConvertOptions, steps: int) -> int:
    return max(1, int(steps * DDP_WINDOW)) if options.target == "ddp" else 1


def throughput(record: dict[str, Any], warmup: int) -> Throughput | None:
    """Steps `warmup`..end: from the step before the first measured one to the end (the
    synchronised end of the run when the harness stopped it, else the last step)."""
    times = record["times"]
    start = max(1, warmup)
    if len(times) <= start:
        return None
    stopped = record["exit"] == "max-steps" and record.get("end_time") is not None
    end = record["end_time"] if stopped else times[-1]
    samples = record["samples"][-1] - record["samples"][start - 1]
    return Throughput(len(times) - start, end - times[start - 1], samples or None)


def _moving_average(values: list[float], window: int) -> list[float]:
    if window <= 1:
        return values
    return [sum(values[i:i + window]) / window for i in range(len(values) - window + 1)]


def max_relative_difference(reference: list[float], other: list[float], window: int = 1) -> float:
    """The largest |other - reference| / |reference| over the common steps (after a moving
    average over `window` steps); infinity when a loss is not finite or nothing is common."""
    steps = min(len(reference), len(other))
    if steps == 0 or steps < window:
        return float("inf")
    a = _moving_average(reference[:steps], window)
    b = _moving_average(other[:steps], window)
    worst = 0.0
    for x, y in zip(a, b):
        gap = abs(y - x) / max(abs(x), 1e-12)
        if gap != gap:  # NaN
            return float("inf")
        worst = max(worst, gap)
    return worst


def _run_summary(record: dict[str, Any], warmup: int) -> dict[str, Any]:
    speed = throughput(record, warmup)
    return {
        "steps": len(record["losses"]),
        "exit": record["exit"],
        "steps_per_s": speed.steps_per_s if speed else None,
        "samples_per_s": speed.samples_per_s if speed else None,
        "peak_rss_bytes": record.get("peak_rss_bytes"),
        "peak_cuda_bytes": record.get("peak_cuda_bytes"),
        "losses": record["losses"],
    }


def summarise(
    original: dict[str, Any],
    converted: dict[str, Any],
    options: ConvertOptions,
    warmup: int,
    tolerance: float,
) -> dict[str, Any]:
    """What `autoaccel bench` reports (and writes as bench.json) for two records."""
    runs = {"original": _run_summary(original, warmup), "converted": _run_summary(converted, warmup)}
    steps = min(len(original["losses"]), len(converted["losses"]))
    difference = max_relative_difference(
        original["losses"], converted["losses"], smoothing_window(options, steps)
    )
    return {
        "device": original.get("device"),
        "device_name": original.get("device_name"),
        "torch_version": original.get("torch_version"),
        "warmup": warmup,
        "runs": runs,
        "speedup": _speedup(runs["original"], runs["converted"]),
        "compared_steps": steps,
        "max_rel_diff": difference if difference != float("inf") else None,
        "tolerance": tolerance,
        "agree": difference <= tolerance,
    }


def _speedup(original: dict[str, Any], converted: dict[str, Any]) -> float | None:
    """Ratio of samples/s (steps/s when no batch was seen)."""
    for key in ("samples_per_s", "steps_per_s"):
        if original[key] and converted[key]:
            return converted[key] / original[key]
    return None
