"""Horovod is migrated by `--to ddp` only: under `--to fsdp` each of its uses is refused
with its line (a script half on Horovod, half on torchrun would not train)."""

from __future__ import annotations

import libcst as cst

from autoaccel.convert.transforms.distributed._base import DistributedStep
from autoaccel.convert.transforms.distributed._legacy import LegacyMigration


class RefuseHorovod(LegacyMigration, DistributedStep):
    DESCRIPTION = "Refuse Horovod (convert it --to ddp)."
    needs = ("horovod",)
    library = label = "Horovod"
    root = "horovod"
    left_over = (
        "`--to fsdp` does not migrate {library}; convert with `--to ddp`, or migrate it by hand"
    )

    def visit_Module(self, node: cst.Module) -> None:
        self.start_migration()
        self.finish_migration(node)  # every use is left, so every use is reported
