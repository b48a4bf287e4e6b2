"""ACC101: a DataLoader that loads every batch in the training process."""

from __future__ import annotations

import libcst as cst

from autoaccel.analysis.dataset_cuda import MOVE_TO_LOOP, loader_cuda_use
from autoaccel.analysis.program import Kind, Obj, argument
from autoaccel.analysis.script_model import DATALOADER, Missing, Unknown
from autoaccel.analysis.shapes import find
from autoaccel.cst_edit import set_keyword
from autoaccel.lint.rule import Applicability, Invalid, LintRule

WORKERS = "min(8, os.cpu_count() or 1)"
# Measured on CPU (docs: rules/ACC101-dataloader-without-workers.md).
IN_MEMORY_NOTE = (
    "the samples are rows of tensors already in memory (`__getitem__` only indexes them):"
    " worker processes would only add inter-process copies (measured at 0.03-0.24x the speed"
    " of `num_workers=0`)"
)
_TRAIN = "for x, y in loader:\n    model(x).sum().backward()\n"
# Calls that turn an in-memory row into a tensor or a number, and nothing more.
_CONVERSIONS = frozenset(
    {
        "torch.tensor", "torch.as_tensor", "torch.from_numpy", "torch.LongTensor",
        "torch.FloatTensor", "builtins.int", "builtins.float", "builtins.list", "builtins.tuple",
    }
)  # fmt: skip


class DataLoaderWithoutWorkers(LintRule):
    code = "ACC101"
    name = "dataloader-without-workers"
    message = "`DataLoader` loads batches in the main process (`num_workers=0`)"
    fix_title = "Add `num_workers` from `os.cpu_count()` and `persistent_workers=True`"
    # Worker processes need a picklable dataset (and a `__main__` guard where
    # processes are spawned), and they change random augmentation streams.
    applicability = Applicability.UNSAFE

    VALID = [
        "from torch.utils.data import DataLoader\nloader = DataLoader(ds, num_workers=4)\n"
        + _TRAIN,
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
        # Rows of tensors in memory: workers would only slow loading down.
        "from torch.utils.data import DataLoader, TensorDataset\n"
        "loader = DataLoader(TensorDataset(x, y))\n" + _TRAIN,
        "from torch.utils.data import DataLoader, Dataset\n"
        "class Rows(Dataset):\n    def __getitem__(self, i):\n"
        "        return self.x[i], int(self.y[i])\n"
        "loader = DataLoader(Rows())\n" + _TRAIN,
        # Pre-tokenised ids held in memory, sliced and made tensors per sample.
        "import torch\nfrom torch.utils.data import DataLoader, Dataset\n"
        "class Tokens(Dataset):\n    def __getitem__(self, i):\n"
        "        chunk = self.ids[i : i + self.block + 1]\n"
        "        return {'input_ids': torch.tensor(chunk[:-1], dtype=torch.long),"
        " 'labels': torch.tensor(chunk[1:])}\n"
        "loader = DataLoader(Tokens())\n" + _TRAIN,
        # A list of samples in memory.
        "from torch.utils.data import DataLoader\nloader = DataLoader([(x, y) for x, y in pairs])\n"
        + _TRAIN,
        # A Dataset that uses CUDA per sample: a forked worker cannot (pytorch/pytorch#77159).
        "from torch.utils.data import DataLoader, Dataset\n"
        "class Clips(Dataset):\n    def __getitem__(self, i):\n"
        "        return self.augment(self.clips[i]).cuda(), self.labels[i]\n"
        "loader = DataLoader(Clips())\n" + _TRAIN,
        # Workers on the CUDA path only (pytorch/examples' `cuda_kwargs`): the script's choice.
        "from torch.utils.data import DataLoader\nkw = {'batch_size': 8}\n"
        "if cuda:\n    kw.update({'num_workers': 1})\nloader = DataLoader(ds, **kw)\n" + _TRAIN,
    ]
    INVALID = [
        # A sample computed per index (decoding, augmentation): workers run it in parallel.
        Invalid(
            "from torch.utils.data import DataLoader, Dataset\n"
            "class Images(Dataset):\n    def __getitem__(self, i):\n"
            "        return self.augment(self.images[i]), self.labels[i]\n"
            "loader = DataLoader(Images())\n" + _TRAIN,
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
        cuda = loader_cuda_use(node, self.script)
        if cuda is not None:
            self.note(
                node,
                f"the Dataset's `__getitem__` may use CUDA ({cuda}): a forked worker process"
                f' cannot ("Cannot re-initialize CUDA in forked subprocess"); {MOVE_TO_LOOP}'
                " to use workers",
            )
            return
        if self.script.in_memory(node) or self._rows_in_memory(node):
            self.note(node, IN_MEMORY_NOTE)
            return
        if self.script.sometimes_missing(node, "num_workers") is not None:
            self.note(
                node,
                "the script sets `num_workers` on some paths only (an `.update()` under a"
                " condition, e.g. pytorch/examples' `cuda_kwargs`): its choice is kept",
            )
            return
        workers = self.script.keyword(node, "num_workers")
        if isinstance(workers, Unknown) or not (isinstance(workers, Missing) or _is_zero(workers)):
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

    def _rows_in_memory(self, loader: cst.Call) -> bool:
        """Whether every dataset `loader` may read holds its samples in memory: a list
        or tuple, or a Dataset of the project whose `__getitem__` only indexes or slices
        its attributes and makes tensors of what it read (pre-tokenised ids)."""
        dataset = argument(loader, 0, "dataset")
        datasets = self.script.values(dataset) if dataset is not None else frozenset()
        return bool(datasets) and all(self._reads_memory(obj) for obj in datasets)

    def _reads_memory(self, dataset: Obj) -> bool:
        if dataset.kind in (Kind.TENSOR_DATASET, Kind.CONTAINER):
            return True
        getitem = dataset.cls.method("__getitem__") if dataset.cls is not None else None
        if getitem is None or len(getitem.positional) != 2:
            return False
        index = getitem.module.index
        names = {getitem.positional[1], "self"}
        body = getitem.node.body.body if isinstance(getitem.node.body, cst.IndentedBlock) else ()
        statements = [s for s in body if not _is_docstring(s)]
        for statement in statements[:-1]:
            assign = statement.body[0] if isinstance(statement, cst.SimpleStatementLine) else None
            if not (
                isinstance(assign, cst.Assign)
                and len(assign.targets) == 1
                and isinstance(assign.targets[0].target, cst.Name)
                and _reads(assign.value, names, index)
            ):
                return False
            names.add(assign.targets[0].target.value)
        last = (
            statements[-1].body[0]
            if statements and isinstance(statements[-1], cst.SimpleStatementLine)
            else None
        )
        return (
            isinstance(last, cst.Return)
            and last.value is not None
            and _reads(last.value, names, index)
        )


def _reads(value: cst.BaseExpression, names: set[str], index) -> bool:
    """Whether `value` only reads memory: `self.x[i]`, `chunk[1:]`, `self.x[i : i + n]`,
    displays of such values, and their conversions (`torch.tensor(...)`)."""
    if isinstance(value, (cst.Integer, cst.Float, cst.SimpleString)):
        return True
    if isinstance(value, cst.Name):
        return value.value in names
    if isinstance(value, cst.Attribute):
        return _reads(value.value, names, index)
    if isinstance(value, cst.Subscript):
        # the index: the parameter, locals, attributes, numbers and arithmetic; no calls
        return (
            _reads(value.value, names, index)
            and not any(find(e, cst.Call) for e in value.slice)
            and all(
                n.value in names
                for e in value.slice
                for n in find(e, cst.Name)
                if not _is_attr_name(n, e)
            )
        )
    if isinstance(value, cst.BinaryOperation):
        return _reads(value.left, names, index) and _reads(value.right, names, index)
    if isinstance(value, (cst.Tuple, cst.List)):
        return all(_reads(e.value, names, index) for e in value.elements)
    if isinstance(value, cst.Dict):
        return all(
            isinstance(e, cst.DictElement)
            and _reads(e.key, names, index)
            and _reads(e.value, names, index)
            for e in value.elements
        )
    if isinstance(value, cst.Call) and index.qualified_names(value.func) & _CONVERSIONS:
        return all(
            _reads(a.value, names, index) or (a.keyword is not None and not find(a.value, cst.Call))
            for a in value.args
        )
    return False


def _is_attr_name(name: cst.Name, within: cst.CSTNode) -> bool:
    """Whether `name` is the attribute part of an `x.name` inside `within`."""
    return any(a.attr is name for a in find(within, cst.Attribute))


def _is_docstring(statement: cst.BaseStatement) -> bool:
    return (
        isinstance(statement, cst.SimpleStatementLine)
        and isinstance(statement.body[0], cst.Expr)
        and isinstance(statement.body[0].value, cst.SimpleString)
    )


def _is_zero(value: cst.BaseExpression) -> bool:
    return isinstance(value, cst.Integer) and value.evaluated_value == 0


def _written_in(call: cst.Call, value: cst.BaseExpression) -> bool:
    return any(arg.value is value for arg in call.args)
