"""ACC101: a DataLoader that loads every batch in the training process."""

from __future__ import annotations

import libcst as cst

from autoaccel.analysis.script_model import DATALOADER, Missing, Unknown
from autoaccel.cst_edit import set_keyword
from autoaccel.lint.rule import Applicability, Invalid, LintRule

WORKERS = "min(8, os.cpu_count() or 1)"


class DataLoaderWithoutWorkers(LintRule):
    code = "ACC101"
    name = "dataloader-without-workers"
    message = "`DataLoader` loads batches in the main process (`num_workers=0`)"
    fix_title = "Add `num_workers` from `os.cpu_count()` and `persistent_workers=True`"
    # Worker processes need a picklable dataset (and a `__main__` guard where
    # processes are spawned), and they change random augmentation streams.
    applicability = Applicability.UNSAFE

    VALID = [
        "from torch.utils.data import DataLoader\nDataLoader(ds, num_workers=4)\n",
        # A value we cannot see is not reported.
        "from torch.utils.data import DataLoader\nDataLoader(ds, **options)\n",
        "from torch.utils.data import DataLoader\nkw = {'num_workers': 2}\nDataLoader(ds, **kw)\n",
        "from mylib import DataLoader\nDataLoader(ds)\n",
    ]
    INVALID = [
        Invalid(
            "from torch.utils.data import DataLoader\nDataLoader(ds, num_workers=0)\n",
            fixed="import os\n\nfrom torch.utils.data import DataLoader\n"
            f"DataLoader(ds, num_workers={WORKERS}, persistent_workers=True)\n",
        ),
    ]

    def visit_Call(self, node: cst.Call) -> None:
        if not self.calls(node, DATALOADER):
            return
        workers = self.script.keyword(node, "num_workers")
        if isinstance(workers, Unknown) or not (
            isinstance(workers, Missing) or _is_zero(workers)
        ):
            return
        call = node
        edits: dict[cst.CSTNode, cst.CSTNode] = {}
        if isinstance(workers, Missing) or _written_in(node, workers):
            call = set_keyword(call, "num_workers", WORKERS)
        else:  # the 0 lives in a `**kwargs` dict: change it there
            edits[workers] = cst.parse_expression(WORKERS)
        if isinstance(self.script.keyword(node, "persistent_workers"), Missing):
            call = set_keyword(call, "persistent_workers", "True")
        if call is not node:
            edits[node] = call
        self.report(node, edits=edits, imports=("os",))


def _is_zero(value: cst.BaseExpression) -> bool:
    return isinstance(value, cst.Integer) and value.evaluated_value == 0


def _written_in(call: cst.Call, value: cst.BaseExpression) -> bool:
    return any(arg.value is value for arg in call.args)
