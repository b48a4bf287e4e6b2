"""`--sync-bn`: BatchNorm layers of the trained models become SyncBatchNorm, whose
statistics cover the global batch instead of each process's share."""

from __future__ import annotations

import libcst as cst

from autoaccel.analysis.shapes import find, is_attribute
from autoaccel.convert.log import ConvertOptions
from autoaccel.convert.transforms.distributed._base import (
    DISTRIBUTED,
    DistributedStep,
    parse_statements,
)


class ConvertSyncBatchNorm(DistributedStep):
    DESCRIPTION = "Convert BatchNorm to SyncBatchNorm in the trained models."

    @classmethod
    def enabled(cls, options: ConvertOptions) -> bool:
        return options.sync_bn

    def visit_Module(self, node: cst.Module) -> None:
        if any(is_attribute(a, "convert_sync_batchnorm") for a in find(node, cst.Attribute)):
            return
        for model in self.trained_models(node):
            key = model.key
            self.after.setdefault(model.anchor, []).extend(
                parse_statements(
                    f"if {DISTRIBUTED}:\n"
                    f"    {key} = torch.nn.SyncBatchNorm.convert_sync_batchnorm({key})\n"
                )
            )
            self.changed(model.anchor, f"BatchNorm layers of `{key}` become SyncBatchNorm")
