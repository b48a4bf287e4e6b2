"""The process group destroyed after the sharded models and their optimizers are freed
(why, with the numbers: `distributed/destroy_process_group.py`)."""

from __future__ import annotations

import libcst as cst

from autoaccel.convert.transforms.distributed.destroy_process_group import DestroyProcessGroup
from autoaccel.convert.transforms.fully_sharded._sharded import given_to_shard


class DestroyAfterModels(DestroyProcessGroup):
    DESCRIPTION = (
        "Free the sharded models, then destroy the process group at the end of the script."
    )

    def communicating(self, module: cst.Module) -> set[str]:
        """The sharded models, and the optimizers that hold their sharded parameters."""
        return given_to_shard(module) | self.script.optimizers
