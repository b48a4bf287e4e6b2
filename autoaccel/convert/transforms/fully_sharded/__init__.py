"""`--to fsdp`: the `--to ddp` scaffolding (set-up, sharded loaders, rank-0 IO, refusals)
with the model sharded by FSDP2's `fully_shard` instead of wrapped in DDP.

Two DDP steps are left out: `NoSyncAccumulation` (it needs a DDP wrapper; FSDP reduces
gradients on every micro-step, which is slower but right) and `ShardEvaluation` (a forward
of a sharded model needs every process, so every process evaluates the whole set, as many
batches as the others).
"""

from autoaccel.convert.transforms.distributed import (
    DDP_STEPS,
    GuardRankZero,
    NoSyncAccumulation,
    ShardEvaluation,
    WrapModel,
)
from autoaccel.convert.transforms.fully_sharded.gather_state_dicts import GatherStateDicts
from autoaccel.convert.transforms.fully_sharded.shard_model import ShardModel


def _fsdp_steps() -> list:
    steps = [ShardModel if step is WrapModel else step for step in DDP_STEPS]
    steps = [step for step in steps if step not in (NoSyncAccumulation, ShardEvaluation)]
    steps.insert(steps.index(GuardRankZero), GatherStateDicts)
    return steps


FSDP_STEPS = _fsdp_steps()
