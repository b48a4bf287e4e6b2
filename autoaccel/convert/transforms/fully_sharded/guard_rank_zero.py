"""Rank-0 IO as under `--to ddp`, except that a function that writes keeps running on
every rank when it gathers the model's shards (`full_state_dict()` before a checkpoint
save) or runs the sharded model (PyTorch-GAN's `sample_image()`: the generator's forward
pass needs every process); only its writes go under `if RANK == 0:`."""

from __future__ import annotations

import libcst as cst

from autoaccel.analysis.names import name_key
from autoaccel.analysis.program import FunctionInfo
from autoaccel.analysis.shapes import find
from autoaccel.convert.transforms.distributed import GuardRankZero
from autoaccel.convert.transforms.distributed.compute_before_printing import (
    model_runners,
    runs_model,
    script_functions,
)
from autoaccel.convert.transforms.fully_sharded._helpers import COLLECTIVES
from autoaccel.convert.transforms.fully_sharded._sharded import sharded_models


class GuardRankZeroGathering(GuardRankZero):
    collectives = COLLECTIVES

    def runs_on_every_rank(self, module: cst.Module, function: cst.FunctionDef) -> bool:
        sharded, functions = sharded_models(module, self.script), script_functions(module)
        runners = model_runners(module, sharded)
        return super().runs_on_every_rank(module, function) or any(
            runs_model(call, sharded, functions, (), runners) for call in find(function, cst.Call)
        )

    def helper_on_every_rank(
        self, module: cst.Module, call: cst.Call, helper: FunctionInfo
    ) -> str | None:
        """Also when it is given a sharded model: every process holds a shard of it."""
        sharded = sharded_models(module, self.script)
        given = next((name_key(a.value) for a in call.args if name_key(a.value) in sharded), None)
        if given is None:
            return super().helper_on_every_rank(module, call, helper)
        return (
            f"it is given the sharded `{given}`, of which each process holds a part (every"
            f" process gathers the whole state dict with `full_state_dict({given})`)"
        )
