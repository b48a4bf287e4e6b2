"""Resolve what a name in a script refers to, however it was imported."""

from __future__ import annotations

import libcst as cst

# Public re-exports, so that `torch.utils.data.dataloader.DataLoader` and
# `torch.utils.data.DataLoader` are one thing to the rules.
_CANONICAL_PREFIXES = {
    "torch.utils.data.dataloader.": "torch.utils.data.",
    "torch.utils.data.distributed.": "torch.utils.data.",
    "torch.utils.data.dataset.": "torch.utils.data.",
    "torch.nn.modules.conv.": "torch.nn.",
    "torch.nn.modules.loss.": "torch.nn.",
    "torch.nn.modules.linear.": "torch.nn.",
    "torch.nn.parallel.data_parallel.": "torch.nn.",
    "torch.nn.parallel.DataParallel": "torch.nn.DataParallel",
    "torch.nn.parallel.distributed.": "torch.nn.parallel.",
    "torch.optim.adam.": "torch.optim.",
    "torch.optim.adamw.": "torch.optim.",
    "torch.optim.sgd.": "torch.optim.",
    "torch.autograd.variable.": "torch.autograd.",
    "torch.distributed.distributed_c10d.": "torch.distributed.",
}


def canonical(name: str) -> str:
    """Map a module-internal torch path onto its public spelling."""
    for prefix, public in _CANONICAL_PREFIXES.items():
        if name.startswith(prefix):
            return public + name[len(prefix) :]
    return name


def name_key(node: cst.BaseExpression) -> str | None:
    """A stable key for a variable: `x`, or `self.x` for an attribute of `self`.

    Rules and transforms track script objects (loaders, models, optimizers) by this
    key so that top-level code, functions and class methods are treated alike.
    """
    if isinstance(node, cst.Name):
        return node.value
    if (
        isinstance(node, cst.Attribute)
        and isinstance(node.value, cst.Name)
        and node.value.value == "self"
    ):
        return f"self.{node.attr.value}"
    return None
