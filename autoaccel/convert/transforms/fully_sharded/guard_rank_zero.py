"""Rank-0 IO as under `--to ddp`, except that a function saving a checkpoint keeps
running on every rank: it gathers the model's shards first (`full_state_dict()`)."""

from __future__ import annotations

from autoaccel.convert.transforms.distributed import GuardRankZero
from autoaccel.convert.transforms.fully_sharded._helpers import COLLECTIVES


class GuardRankZeroGathering(GuardRankZero):
    collectives = COLLECTIVES
