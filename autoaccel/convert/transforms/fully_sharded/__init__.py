"""`--to fsdp`: the `--to ddp` scaffolding (set-up, sharded loaders, rank-0 IO, refusals)
with the model sharded by FSDP2's `fully_shard` instead of wrapped in DDP.

Two DDP steps are left out: `NoSyncAccumulation` (it needs a DDP wrapper; FSDP reduces
gradients on every micro-step, which is slower but right) and `ShardEvaluation` (a forward
of a sharded model needs every process, so every process evaluates the whole set, as many
batches as the others). The migrations of Horovod and `torch.distributed.launch` scripts
are ddp's only: a launch or apex.parallel script is refused by `InitProcessGroup` ("already
sets up torch.distributed"), each use of Horovod by `RefuseHorovod`.
"""

from autoaccel.convert.transforms.distributed import (
    DDP_STEPS,
    ComputeBeforePrinting,
    DestroyProcessGroup,
    GuardRankZero,
    MigrateHorovod,
    MigrateLaunch,
    NoSyncAccumulation,
    ShardEvaluation,
    WrapModel,
)
from autoaccel.convert.transforms.fully_sharded.compute_before_printing import (
    ShardedComputeBeforePrinting,
)
from autoaccel.convert.transforms.fully_sharded.destroy_after_models import DestroyAfterModels
from autoaccel.convert.transforms.fully_sharded.every_rank_computes import EveryRankComputes
from autoaccel.convert.transforms.fully_sharded.gather_state_dicts import GatherStateDicts
from autoaccel.convert.transforms.fully_sharded.guard_rank_zero import GuardRankZeroGathering
from autoaccel.convert.transforms.fully_sharded.refuse_horovod import RefuseHorovod
from autoaccel.convert.transforms.fully_sharded.shard_model import ShardModel
from autoaccel.convert.transforms.fully_sharded.zero_grad_before_forward import (
    ZeroGradBeforeForward,
)

_REPLACED = {
    WrapModel: [ShardModel, ZeroGradBeforeForward],
    MigrateHorovod: [RefuseHorovod],
    DestroyProcessGroup: [DestroyAfterModels],
    GuardRankZero: [
        GatherStateDicts,
        ShardedComputeBeforePrinting,
        GuardRankZeroGathering,
        EveryRankComputes,
    ],
}
# ComputeBeforePrinting comes before ShardEvaluation in ddp; fsdp has no ShardEvaluation
# and runs its own version with the steps that replace GuardRankZero.
_LEFT_OUT = (NoSyncAccumulation, ShardEvaluation, MigrateLaunch, ComputeBeforePrinting)

FSDP_STEPS = [
    replacement
    for step in DDP_STEPS
    if step not in _LEFT_OUT
    for replacement in _REPLACED.get(step, [step])
]
