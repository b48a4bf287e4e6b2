"""ACC102: a DataLoader feeding a CUDA script without page-locked memory."""

from __future__ import annotations

import libcst as cst

from autoaccel.analysis.script_model import DATALOADER, Missing, Unknown
from autoaccel.analysis.shapes import is_false
from autoaccel.cst_edit import set_keyword
from autoaccel.lint.rule import Invalid, LintRule

PIN_MEMORY = "torch.cuda.is_available()"


class DataLoaderWithoutPinMemory(LintRule):
    code = "ACC102"
    name = "dataloader-without-pin-memory"
    message = "`DataLoader` feeding CUDA does not pin memory (`pin_memory=False`)"
    fix_title = "Add `pin_memory=torch.cuda.is_available()`"

    VALID = [
        # A CPU-only script gains nothing from pinned memory.
        "import torch\nfrom torch.utils.data import DataLoader\nDataLoader(ds)\n",
        "import torch\nfrom torch.utils.data import DataLoader\n"
        "DataLoader(ds, pin_memory=True)\nmodel.cuda()\n",
        "import torch\nfrom torch.utils.data import DataLoader\n"
        "DataLoader(ds, **kwargs)\nmodel.cuda()\n",
    ]
    INVALID = [
        Invalid(
            "import torch\nfrom torch.utils.data import DataLoader\nDataLoader(ds)\nmodel.cuda()\n",
            fixed="import torch\nfrom torch.utils.data import DataLoader\n"
            f"DataLoader(ds, pin_memory={PIN_MEMORY})\nmodel.cuda()\n",
        ),
    ]

    def visit_Call(self, node: cst.Call) -> None:
        if not self.script.uses_cuda or not self.calls(node, DATALOADER):
            return
        pinned = self.script.keyword(node, "pin_memory")
        if isinstance(pinned, Unknown):
            return
        if isinstance(pinned, Missing) or is_false(pinned):
            edits = (
                {node: set_keyword(node, "pin_memory", PIN_MEMORY)}
                if isinstance(pinned, Missing) or any(a.value is pinned for a in node.args)
                else {pinned: cst.parse_expression(PIN_MEMORY)}
            )
            self.report(node, edits=edits)
