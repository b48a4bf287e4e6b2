"""The process group destroyed after the sharded models and their optimizers are freed
(why, with the numbers: `distributed/destroy_process_group.py`)."""

from __future__ import annotations

import libcst as cst

from autoaccel.analysis.program import Kind, Obj, Program
from autoaccel.analysis.shapes import name_calls
from autoaccel.convert.transforms.distributed.destroy_process_group import DestroyProcessGroup
from autoaccel.convert.transforms.fully_sharded._helpers import SHARD
from autoaccel.convert.transforms.fully_sharded._sharded import given_to_shard


class DestroyAfterModels(DestroyProcessGroup):
    DESCRIPTION = (
        "Free the sharded models, then destroy the process group at the end of the script."
    )

    def communicating(self, module: cst.Module) -> set[str]:
        """The sharded models, the optimizers that hold their sharded parameters, and
        what holds either (`exp`, whose `train()` shards `self.model`)."""
        return given_to_shard(module) | self.script.optimizers | self.holders(module)

    def communicating_objects(self, program: Program) -> set[Obj]:
        """The models given to `shard_model(...)` anywhere in the program, and the
        optimizers."""
        sharded = {
            obj
            for source in program.modules
            for call in name_calls(source.tree, SHARD)
            if call.args
            for obj in program.values_of(call.args[0].value, source)
        }
        return sharded | set(program.objects(Kind.OPTIMIZER))
