"""Run the sharded model, and the helpers that gather its state, on every process
before a print that only rank 0 will run (why: `distributed/compute_before_printing.py`)."""

from __future__ import annotations

import libcst as cst

from autoaccel.convert.transforms.distributed.compute_before_printing import ComputeBeforePrinting
from autoaccel.convert.transforms.fully_sharded._helpers import COLLECTIVES
from autoaccel.convert.transforms.fully_sharded._sharded import sharded_models


class ShardedComputeBeforePrinting(ComputeBeforePrinting):
    DESCRIPTION = "Run sharded-model calls of a print on every process, before the print."
    code = "fsdp"
    collectives = COLLECTIVES

    def models(self, module: cst.Module) -> set[str]:
        return sharded_models(module, self.script)
