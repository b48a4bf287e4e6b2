"""Which DataLoader settings to try, in which order, and which one wins (no torch here).

The sweep is greedy, one knob at a time, each stage starting from the best setting so far:
`num_workers` over 0, 1, 2, 4, ... up to the limit (with `persistent_workers=True`, which
saves restarting the workers every epoch), then the best count without persistent workers,
then `prefetch_factor` 4 and 8, then (on CUDA) `pin_memory` flipped. A setting replaces the
best only when it is clearly faster (`clearly_faster`), so timing noise does not rewrite a
script. A `reference` setting (the one `autoaccel convert` writes) is measured too, as a
candidate like the others.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any
from collections.abc import Callable

MIN_GAIN = 1.03
PREFETCH_FACTORS = (4, 8)


@dataclass(frozen=True)
class LoaderSetting:
    num_workers: int = 0
    pin_memory: bool = False
    persistent_workers: bool = False
    prefetch_factor: int | None = None  # None: the DataLoader default (2 with workers)

    def normalised(self) -> LoaderSetting:
        """The same setting with what a DataLoader without workers rejects left out."""
        if self.num_workers == 0:
            return replace(self, persistent_workers=False, prefetch_factor=None)
        return self

    def keywords(self) -> dict[str, object]:
        """DataLoader keyword arguments for this setting."""
        keywords: dict[str, object] = {
            "num_workers": self.num_workers,
            "pin_memory": self.pin_memory,
        }
        if self.num_workers:
            keywords["persistent_workers"] = self.persistent_workers
            if self.prefetch_factor is not None:
                keywords["prefetch_factor"] = self.prefetch_factor
        return keywords

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


@dataclass(frozen=True)
class Measurement:
    setting: LoaderSetting
    batches_per_s: float | None = None  # over an epoch: the median of the passes
    first_batch_s: float | None = None  # iterator start-up until the first batch
    error: str | None = None
    batches_per_s_range: tuple[float, float] | None = None  # the slowest and fastest pass

    def as_dict(self) -> dict[str, object]:
        return {**asdict(self), "setting": self.setting.as_dict()}

    @classmethod
    def from_dict(cls, fields: dict[str, Any]) -> Measurement:
        """The measurement `as_dict` gave, read back (from JSON)."""
        spread = fields["batches_per_s_range"]
        return cls(
            LoaderSetting(**fields["setting"]),
            fields["batches_per_s"],
            fields["first_batch_s"],
            fields["error"],
            tuple(spread) if spread else None,
        )


def worker_counts(limit: int) -> list[int]:
    """0, 1, 2, 4, 8, ... up to `limit`, and `limit` itself."""
    counts, count = [0], 1
    while count < limit:
        counts.append(count)
        count *= 2
    return counts + [limit] if limit > 0 else counts


def planned_count(limit: int, with_workers: bool, cuda: bool, reference: bool = False) -> int:
    """How many settings `sweep` measures at most (the current one included)."""
    if not with_workers:
        return 1 + 1 + int(cuda)
    return 1 + int(reference) + len(worker_counts(limit)) + 1 + len(PREFETCH_FACTORS) + int(cuda)


Stage = Callable[[LoaderSetting], list[LoaderSetting]]


def _stages(
    limit: int, with_workers: bool, cuda: bool, reference: LoaderSetting | None
) -> list[Stage]:
    """Each stage maps the best setting so far to the candidates it tries."""
    counts = worker_counts(limit) if with_workers else [0]
    stages: list[Stage] = []
    if reference is not None and with_workers:
        stages.append(lambda best: [reference])
    stages.append(
        lambda best: [
            replace(best, num_workers=n, persistent_workers=True, prefetch_factor=None)
            for n in counts
        ]
    )
    if with_workers:
        stages.append(
            lambda best: [replace(best, persistent_workers=False)] if best.num_workers else []
        )
        stages.append(
            lambda best: (
                [replace(best, prefetch_factor=f) for f in PREFETCH_FACTORS]
                if best.num_workers
                else []
            )
        )
    if cuda:
        stages.append(lambda best: [replace(best, pin_memory=not best.pin_memory)])
    return stages


def sweep(
    current: LoaderSetting,
    measure: Callable[[LoaderSetting], Measurement],
    limit: int,
    with_workers: bool = True,
    cuda: bool = False,
    reference: LoaderSetting | None = None,
) -> tuple[list[Measurement], Measurement]:
    """Measure `current` and `reference`, then the stages; return every measurement and
    the best one."""
    done: dict[LoaderSetting, Measurement] = {}

    def measured(setting: LoaderSetting) -> Measurement:
        if setting not in done:
            done[setting] = measure(setting)
        return done[setting]

    best = measured(current.normalised())
    for stage in _stages(limit, with_workers, cuda, reference):
        for setting in stage(best.setting):
            result = measured(setting.normalised())
            if clearly_faster(result, best):
                best = result
    return list(done.values()), best


def clearly_faster(candidate: Measurement, incumbent: Measurement) -> bool:
    """`candidate` is at least `MIN_GAIN` faster than `incumbent` and, beyond the spread
    of the passes, its slowest pass is faster than the incumbent's fastest."""
    if candidate.batches_per_s is None:
        return False
    if incumbent.batches_per_s is None:
        return True
    if candidate.batches_per_s_range and incumbent.batches_per_s_range:
        if candidate.batches_per_s_range[0] <= incumbent.batches_per_s_range[1]:
            return False
    return candidate.batches_per_s >= incumbent.batches_per_s * MIN_GAIN
