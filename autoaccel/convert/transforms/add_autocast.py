"""Mixed precision: run the forward pass and loss under `torch.autocast`."""

from __future__ import annotations

import libcst as cst

from autoaccel.convert.transform import Transform


class AddAutocast(Transform):
    DESCRIPTION = "Run forward passes and losses under torch.autocast."
    code = "ACC301"

    def should_run(self) -> bool:
        return self.options.amp != "off"

    def transform_module_impl(self, tree: cst.Module) -> cst.Module:
        return tree
