"""A training loss summed over the batch (`reduction="sum"`, legacy `size_average=False`).

DDP averages gradients over processes, and each process sums over its share of the
global batch, so every update is 1/WORLD_SIZE of the original's (pytorch/examples' VAE
sums). Reported with its line, not rewritten: scaling the loss by WORLD_SIZE in
`backward()`, or averaging and rescaling the learning rate, is the author's choice.
With `--per-process-batch` each process sums a whole batch and the average keeps the
scale, so nothing is reported.
"""

from __future__ import annotations

import libcst as cst

from autoaccel.analysis.names import name_key
from autoaccel.analysis.shapes import find, is_false
from autoaccel.convert.transforms.distributed._base import WORLD_SIZE, DistributedStep
from autoaccel.cst_edit import keyword_value


class ReportSummedLoss(DistributedStep):
    DESCRIPTION = "Report training losses summed over the batch."
    reports_only = True
    needs = ('"sum"', "'sum'", "size_average")

    def visit_Module(self, node: cst.Module) -> None:
        if self.options.per_process_batch:
            return
        criteria = {
            key
            for assign in find(node, cst.Assign)
            if isinstance(assign.value, cst.Call) and _sums(assign.value)
            for target in assign.targets
            if (key := name_key(target.target))
        }
        helpers = {
            f.name.value for f in find(node, cst.FunctionDef) if any(map(_sums, find(f.body, cst.Call)))
        }
        for loop in self.train_loops():
            for call in find(loop.body, cst.Call):
                key = name_key(call.func) or ""
                if _sums(call) or key in criteria or key.removeprefix("self.") in helpers:
                    self.skipped(
                        "summed loss",
                        "this training loss is a sum over the batch: DDP averages gradients"
                        " over processes and each sums only its share, so every update is"
                        f" 1/{WORLD_SIZE} of the original's; multiply the loss by {WORLD_SIZE}"
                        " in backward() (or average it and rescale the learning rate) by hand",
                        call,
                        wrong=True,
                    )
                    break


def _sums(call: cst.Call) -> bool:
    """`reduction="sum"` or `size_average=False` among the call's keywords."""
    reduction = keyword_value(call, "reduction")
    if isinstance(reduction, cst.SimpleString) and reduction.evaluated_value == "sum":
        return True
    return is_false(keyword_value(call, "size_average"))
