"""`--to dp`: the seeds' balanced `nn.DataParallel`, each GPU computing its own loss.

Two steps, in order: `ComputeLossInForward` moves every training step's loss into a
generated `ModelWithLoss` module replicated by `nn.DataParallel`; `UnwrapDataParallel`
then removes a script's own `nn.DataParallel` around a model that `ModelWithLoss` now
replicates, so the model's name points at the bare model again.
"""

from __future__ import annotations

from autoaccel.convert.transform import Transform
from autoaccel.convert.transforms.data_parallel.compute_loss_in_forward import (
    ComputeLossInForward,
    settle_project_refusals,
)
from autoaccel.convert.transforms.data_parallel.unwrap_data_parallel import (
    UnwrapDataParallel,
)

DP_STEPS: list[type[Transform]] = [ComputeLossInForward, UnwrapDataParallel]

__all__ = ["DP_STEPS", "ComputeLossInForward", "UnwrapDataParallel", "settle_project_refusals"]
