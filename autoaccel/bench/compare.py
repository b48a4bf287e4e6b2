"""Numbers from the harness records of the alternated runs: throughput and its spread,
the speed-up and whether it is measurable, peak memory, and how well the loss curves agree."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

from autoaccel.convert.log import MULTI_PROCESS, ConvertOptions

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
    if options.target in MULTI_PROCESS:
        return max(DDP, AMP[options.amp])
    tolerance = AMP[options.amp] or EXACT
    if options.compile or options.channels_last:
        tolerance = max(tolerance, REORDERED)
    return tolerance


def smoothing_window(options: ConvertOptions, steps: int) -> int:
    return max(1, int(steps * DDP_WINDOW)) if options.target in MULTI_PROCESS else 1


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


def moving_average(values: list[float], window: int) -> list[float]:
    if window <= 1:
        return values
    return [sum(values[i : i + window]) / window for i in range(len(values) - window + 1)]


def max_relative_difference(reference: list[float], other: list[float], window: int = 1) -> float:
    """The largest |other - reference| / |reference| over the common steps (after a moving
    average over `window` steps); infinity when a loss is not finite or nothing is common."""
    steps = min(len(reference), len(other))
    if steps == 0 or steps < window:
        return float("inf")
    a = moving_average(reference[:steps], window)
    b = moving_average(other[:steps], window)
    worst = 0.0
    for x, y in zip(a, b):
        gap = abs(y - x) / max(abs(x), 1e-12)
        if gap != gap:  # NaN
            return float("inf")
        worst = max(worst, gap)
    return worst


# The speed-up is judged from the ratios of the runs taken side by side (A B, A B, ...):
# with n pairs, the range of the n ratios covers the true median ratio with probability
# 1 - 2**(1 - n) (75 % at 3, 94 % at 5), whatever the noise's distribution (a sign test).
MIN_JUDGED_REPEATS = 3
# The smallest difference called faster or slower: 2 % is within a shared machine's drift
# and too little to act on.
MIN_EFFECT = 0.02
FASTER, SLOWER, SAME, NOT_JUDGED = "faster", "slower", "no measurable difference", "not judged"


@dataclass(frozen=True)
class SpeedUp:
    """The paired throughput ratios (converted over original) of the repeated runs, and
    how much the original's runs vary: (max - min) / median of their throughput."""

    ratios: tuple[float, ...]
    noise: float = 0.0

    @property
    def median(self) -> float:
        return statistics.median(self.ratios)

    @property
    def margin(self) -> float:
        """How far from 1 a pair's ratio must be to count: `MIN_EFFECT`, or the
        original's run-to-run spread when that is larger (a difference the same script
        shows between its own runs is not the conversion's)."""
        return max(MIN_EFFECT, self.noise)

    @property
    def verdict(self) -> str:
        """`faster` when every pair's ratio is above 1 + margin, `slower` when every one
        is below 1 / (1 + margin), else no measurable difference: the sign test's range
        must clear the margin, not just 1.00x. Not judged with fewer than
        `MIN_JUDGED_REPEATS` pairs.

        Every pair above 1 + margin puts each order statistic of the converted runs, the
        median included, above (1 + margin) times the original's, so `faster` comes with
        medians at least 2 % apart: never with equal numbers in the table, which shows
        three significant digits (steps of at most 1 %)."""
        if len(self.ratios) < MIN_JUDGED_REPEATS:
            return NOT_JUDGED
        if min(self.ratios) > 1 + self.margin:
            return FASTER
        if max(self.ratios) < 1 / (1 + self.margin):
            return SLOWER
        return SAME


def _metric(original: Throughput | None, converted: Throughput | None) -> str | None:
    """samples/s when both runs saw batches, else steps/s; None without a timing."""
    if original is None or converted is None:
        return None
    return "samples_per_s" if original.samples and converted.samples else "steps_per_s"


def speedup(
    originals: list[dict[str, Any]], converteds: list[dict[str, Any]], warmup: int
) -> SpeedUp | None:
    """The ratio of each pair of runs (samples/s, else steps/s) and the spread of the
    original's runs; None when a run has no timing."""
    ratios, before_rates = [], []
    for original, converted in zip(originals, converteds):
        before, after = throughput(original, warmup), throughput(converted, warmup)
        metric = _metric(before, after)
        if metric is None:
            return None
        before_rates.append(getattr(before, metric))
        ratios.append(getattr(after, metric) / before_rates[-1])
    if not ratios:
        return None
    noise = (max(before_rates) - min(before_rates)) / statistics.median(before_rates)
    return SpeedUp(tuple(ratios), noise)


def _run_figures(record: dict[str, Any], warmup: int) -> dict[str, Any]:
    """One run's numbers, as bench.json lists them under `per_run`."""
    speed = throughput(record, warmup)
    return {
        "exit": record["exit"],
        "steps": len(record["losses"]),
        "seconds": speed.seconds if speed else None,
        "steps_per_s": speed.steps_per_s if speed else None,
        "samples_per_s": speed.samples_per_s if speed else None,
        "peak_rss_bytes": record.get("peak_rss_bytes"),
        "peak_cuda_bytes": record.get("peak_cuda_bytes"),
        "threads": record.get("threads"),
    }


def _median_and_range(values: list[float | None]) -> tuple[float | None, list[float] | None]:
    if not values or any(value is None for value in values):
        return None, None
    return statistics.median(values), [min(values), max(values)]


def _side_summary(records: list[dict[str, Any]], warmup: int) -> dict[str, Any]:
    """A side's medians over its runs, their ranges, every run's figures, and the loss
    curve of its first run."""
    per_run = [_run_figures(record, warmup) for record in records]
    summary: dict[str, Any] = {"steps": per_run[0]["steps"], "exit": per_run[0]["exit"]}
    for key in ("steps_per_s", "samples_per_s"):
        summary[key], summary[f"{key}_range"] = _median_and_range([run[key] for run in per_run])
    for peak in ("peak_rss_bytes", "peak_cuda_bytes"):
        values = [run[peak] for run in per_run if run[peak] is not None]
        summary[peak] = max(values) if values else None
    summary["losses"] = records[0]["losses"]
    summary["per_run"] = per_run
    return summary


def summarise(
    originals: list[dict[str, Any]],
    converteds: list[dict[str, Any]],
    options: ConvertOptions,
    warmup: int,
    tolerance: float,
) -> dict[str, Any]:
    """What `autoaccel bench` reports (and writes as bench.json) for the records of the
    alternated runs; the loss curves compared are the first run's of each side."""
    original, converted = originals[0], converteds[0]
    runs = {
        "original": _side_summary(originals, warmup),
        "converted": _side_summary(converteds, warmup),
    }
    steps = min(len(original["losses"]), len(converted["losses"]))
    window = smoothing_window(options, steps)
    difference = max_relative_difference(original["losses"], converted["losses"], window)
    ratio = speedup(originals, converteds, warmup)
    return {
        "device": original.get("device"),
        "device_name": original.get("device_name"),
        "torch_version": original.get("torch_version"),
        "warmup": warmup,
        "repeats": len(originals),
        "runs": runs,
        "speedup": ratio.median if ratio else None,
        "speedup_range": [min(ratio.ratios), max(ratio.ratios)] if ratio else None,
        "speedup_per_run": list(ratio.ratios) if ratio else None,
        "speed": ratio.verdict if ratio else NOT_JUDGED,
        "speed_margin": ratio.margin if ratio else None,
        "compared_steps": steps,
        "smoothing_window": window,
        "max_rel_diff": difference if difference != float("inf") else None,
        "tolerance": tolerance,
        "agree": difference <= tolerance,
    }
