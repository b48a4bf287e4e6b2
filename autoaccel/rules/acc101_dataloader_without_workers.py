"""ACC101: a DataLoader that loads every batch in the training process."""

from __future__ import annotations

import libcst as cst

from autoaccel.analysis.script_model import DATALOADER, Missing, Unknown
from autoaccel.cst_edit import set_keyword
from autoaccel.lint.rule import Applicability, Invalid, LintRule

WORKERS = "min(8, os.cpu_count() or 1)"
_TRAIN = "for x, y in loader:\n    model(x).sum().backward()\n"


class DataLoaderWithoutWorkers(LintRule):
    code = "ACC101"
    name = "dataloader-without-workers"
    message = "`DataLoader` loads batches in the main process (`num_workers=0`)"
    fix_title = "Add `num_workers` from `os.cpu_count()` and `persistent_workers=True`"
    # Worker processes need a picklable dataset (and a `__main__` guard where
    # processes are spawned), and they change random augmentation streams.
    applicability = Applicability.UNSAFE

    VALID = [
        "from torch.utils.data import DataLoader\nloader = DataLoader(ds, num_workers=4)\n" + _TRAIN,
        # A value we cannot see is not reported.
        "from torch.utils.data import DataLoader\nloader = DataLoader(ds, **options)\n" + _TRAIN,
        "from torch.utils.data import DataLoader\nkw = {'num_workers': 2}\n"
        "loader = DataLoader(ds, **kw)\n" + _TRAIN,
        "from mylib import DataLoader\nloader = DataLoader(ds)\n" + _TRAIN,
        # No training loop reads it (evaluation, a test, a framework's `fit`).
        "from torch.utils.data import DataLoader\nloader = DataLoader(ds)\n"
        "for x, y in loader:\n    model(x)\n",
        "from torch.utils.data import DataLoader\nloader = DataLoader(ds)\ntrainer.fit(model, loader)\n",
        # A stream: each worker would replay all of it (the epoch would double, triple, ...).
        "from torch.utils.data import DataLoader, IterableDataset\n"
        "class Stream(IterableDataset):\n    def __iter__(self):\n        yield from range(8)\n"
        "loader = DataLoader(Stream())\n" + _TRAIN,
    ]
    INVALID = [
        # Workers only on the CUDA path: the CPU path gets a default the update overrides.
        Invalid(
            "from torch.utils.data import DataLoader\nkw = {'batch_size': 8}\n"
            "if cuda:\n    kw.update({'num_workers': 1})\nloader = DataLoader(ds, **kw)\n" + _TRAIN,
            fixed="import os\n\nfrom torch.utils.data import DataLoader\nkw = {\n"
            f"    'batch_size': 8,\n    'num_workers': {WORKERS},\n    'persistent_workers': True,\n}}\n"
            "if cuda:\n    kw.update({'num_workers': 1})\nloader = DataLoader(ds, **kw)\n" + _TRAIN,
        ),
        Invalid(
            "from torch.utils.data import DataLoader\ndl = DataLoader(ds, num_workers=0)\n"
            + _TRAIN.replace("loader", "dl"),
            fixed="import os\n\nfrom torch.utils.data import DataLoader\n"
            f"dl = DataLoader(ds, num_workers={WORKERS}, persistent_workers=True)\n"
            + _TRAIN.replace("loader", "dl"),
        ),
        # The loader reaches the training loop through a function's parameter.
        Invalid(
            "from torch.utils.data import DataLoader\ndef fit(data):\n"
            "    for x, y in data:\n        model(x).sum().backward()\n"
            "loader = DataLoader(ds)\nfit(loader)\n"
        ),
    ]

    def visit_Call(self, node: cst.Call) -> None:
        if not self.calls(node, DATALOADER) or not self.feeds_training_loop(node):
            return
        if self.script.streams(node):
            self.note(
                node,
                "the dataset is an IterableDataset: every worker would yield the whole stream;"
                " split it per worker (`torch.utils.data.get_worker_info()`) before adding workers",
            )
            return
        display = self.script.sometimes_missing(node, "num_workers")
        if display is not None and not _has_key(display, "num_workers"):
            self._report_default_in_dict(node, display)
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


    def _report_default_in_dict(self, node: cst.Call, display: cst.Dict) -> None:
        """`num_workers` reaches `node` only on some paths (`kwargs.update(cuda_kwargs)`
        under `if use_cuda:`): give the dict a default that those updates still override."""
        entries = {"num_workers": WORKERS}
        if isinstance(self.script.keyword(node, "persistent_workers"), Missing):
            entries["persistent_workers"] = "True"
        self.report(node, edits={display: _with_entries(display, entries)}, imports=("os",))


def _has_key(display: cst.Dict, key: str) -> bool:
    return any(
        isinstance(e, cst.DictElement)
        and isinstance(e.key, cst.SimpleString)
        and e.key.evaluated_value == key
        for e in display.elements
    )


def _with_entries(display: cst.Dict, entries: dict[str, str]) -> cst.Dict:
    """`display` with `"key": value` entries appended, quoted like its other keys."""
    keys = [
        e.key for e in display.elements
        if isinstance(e, cst.DictElement) and isinstance(e.key, cst.SimpleString)
    ]
    quote = keys[0].quote if keys else '"'
    comma = cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
    elements = list(display.elements)
    if elements and isinstance(elements[-1].comma, cst.MaybeSentinel):
        elements[-1] = elements[-1].with_changes(comma=comma)
    new = [
        cst.DictElement(cst.SimpleString(f"{quote}{key}{quote}"), cst.parse_expression(value), comma=comma)
        for key, value in entries.items()
    ]
    new[-1] = new[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
    return display.with_changes(elements=[*elements, *new])


def _is_zero(value: cst.BaseExpression) -> bool:
    return isinstance(value, cst.Integer) and value.evaluated_value == 0


def _written_in(call: cst.Call, value: cst.BaseExpression) -> bool:
    return any(arg.value is value for arg in call.args)
