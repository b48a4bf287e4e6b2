"""ACC102: a DataLoader feeding a CUDA script without page-locked memory."""

from __future__ import annotations

import libcst as cst

from autoaccel.analysis.dataset_cuda import MOVE_TO_LOOP, loader_cuda_use
from autoaccel.analysis.script_model import DATALOADER, Missing, Unknown
from autoaccel.analysis.shapes import is_false
from autoaccel.cst_edit import set_keyword
from autoaccel.lint.rule import Invalid, LintRule

PIN_MEMORY = "torch.cuda.is_available()"
_HEAD = "import torch\nfrom torch.utils.data import DataLoader\n"
_TRAIN = "for x, y in loader:\n    model(x).sum().backward()\n"


class DataLoaderWithoutPinMemory(LintRule):
    code = "ACC102"
    name = "dataloader-without-pin-memory"
    message = "`DataLoader` feeding CUDA does not pin memory (`pin_memory=False`)"
    fix_title = "Add `pin_memory=torch.cuda.is_available()`"

    VALID = [
        # A CPU-only script gains nothing from pinned memory.
        _HEAD + "loader = DataLoader(ds)\n" + _TRAIN,
        _HEAD + "loader = DataLoader(ds, pin_memory=True)\nmodel.cuda()\n" + _TRAIN,
        _HEAD + "loader = DataLoader(ds, **kwargs)\nmodel.cuda()\n" + _TRAIN,
        # No training loop reads it.
        _HEAD + "loader = DataLoader(Mock())\nmodel.cuda()\nassert len(loader) == 1\n",
    ]
    INVALID = [
        Invalid(
            _HEAD + "loader = DataLoader(ds)\nmodel.cuda()\n" + _TRAIN,
            fixed=_HEAD
            + f"loader = DataLoader(ds, pin_memory={PIN_MEMORY})\nmodel.cuda()\n"
            + _TRAIN,
        ),
    ]

    def visit_Call(self, node: cst.Call) -> None:
        if (
            not self.script.uses_cuda
            or not self.calls(node, DATALOADER)
            or not self.feeds_training_loop(node)
        ):
            return
        pinned = self.script.keyword(node, "pin_memory")
        if isinstance(pinned, Unknown):
            return
        if isinstance(pinned, Missing) or is_false(pinned):
            cuda = loader_cuda_use(node, self.script)
            if cuda is not None:
                self.note(
                    node,
                    f"the Dataset's `__getitem__` may use CUDA ({cuda}): its samples are on the"
                    f" GPU, which cannot be pinned; {MOVE_TO_LOOP} to pin its batches",
                )
                return
            edits = (
                {node: set_keyword(node, "pin_memory", PIN_MEMORY)}
                if isinstance(pinned, Missing) or any(a.value is pinned for a in node.args)
                else {pinned: cst.parse_expression(PIN_MEMORY)}
            )
            self.report(
                node, edits=edits, imports=("torch",)
            )  # a module may import only DataLoader
