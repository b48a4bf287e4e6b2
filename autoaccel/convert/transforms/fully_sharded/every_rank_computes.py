"""Refuse where only some processes would run a sharded model.

A sharded model's forward pass and a gathering of its state dict are collectives: every
process must run them, the same number of times, or the others wait forever. Code under a
rank test (`if RANK == 0:` of the script, or one the conversion put around a write) that
calls the model, passes it to a function of the script, or gathers its state cannot be right.
"""

from __future__ import annotations

import libcst as cst

from autoaccel.analysis.rank_guards import rank_guarded
from autoaccel.analysis.shapes import find
from autoaccel.convert.transforms.distributed._base import DistributedStep
from autoaccel.convert.transforms.distributed.compute_before_printing import (
    model_runners,
    runs_model,
    script_functions,
)
from autoaccel.convert.transforms.fully_sharded._helpers import COLLECTIVES
from autoaccel.convert.transforms.fully_sharded._sharded import sharded_models


class EveryRankComputes(DistributedStep):
    DESCRIPTION = "Refuse sharded-model computations that only some processes run."
    code = "fsdp"

    def visit_Module(self, node: cst.Module) -> None:
        sharded, functions = sharded_models(node, self.script), script_functions(node)
        runners = model_runners(node, sharded, COLLECTIVES)
        for call in find(node, cst.Call):
            if runs_model(call, sharded, functions, COLLECTIVES, runners) and rank_guarded(
                call, self.ancestors(call)
            ):
                self.skipped(
                    "fully_shard",
                    "this runs the sharded model (or gathers its state) on some processes only,"
                    " while every process must take part; compute it into a variable before the"
                    " rank test, by hand",
                    call,
                    wrong=True,
                )
                return
