"""Refuse where only some processes would run a sharded model.

A sharded model's forward pass and a gathering of its state dict are collectives: every
process must run them, the same number of times, or the others wait forever. Code under a
rank test (`if RANK == 0:` of the script, or one that the conversion put around a print)
that calls the model, passes it to a function, or gathers its state cannot be right.
"""

from __future__ import annotations

import libcst as cst

from autoaccel.analysis.names import name_key
from autoaccel.analysis.rank_guards import rank_guarded
from autoaccel.analysis.shapes import find, is_name, name_calls
from autoaccel.convert.transforms.distributed._base import DistributedStep
from autoaccel.convert.transforms.fully_sharded._helpers import COLLECTIVES, SHARD


class EveryRankComputes(DistributedStep):
    DESCRIPTION = "Refuse sharded-model computations that only some processes run."
    code = "fsdp"
    needs = (SHARD,)

    def visit_Module(self, node: cst.Module) -> None:
        sharded = {name_key(c.args[0].value) for c in name_calls(node, SHARD) if c.args} - {None}
        for call in find(node, cst.Call):
            uses = name_key(call.func) in sharded or any(
                name_key(a.value) in sharded for a in call.args
            )
            if (uses or is_name(call.func, *COLLECTIVES)) and rank_guarded(
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
