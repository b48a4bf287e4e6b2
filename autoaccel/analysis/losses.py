"""What counts as a loss, and which values carry no autograd graph."""

from __future__ import annotations

from collections.abc import Collection

import libcst as cst

from autoaccel.analysis.shapes import is_attribute, is_method_call, is_name

_FUNCTIONAL = "torch.nn.functional."
# `torch.nn.functional` losses whose names do not end in `_loss`.
_FUNCTIONAL_LOSSES = frozenset(
    {"cross_entropy", "binary_cross_entropy", "binary_cross_entropy_with_logits", "kl_div"}
)
# Methods and attributes that leave autograd: the result carries no graph.
_DETACHING = frozenset({"item", "detach", "tolist", "numpy", "data"})


def is_functional_loss(names: Collection[str]) -> bool:
    """Whether one of these qualified names is a `torch.nn.functional` loss."""
    return any(
        n.startswith(_FUNCTIONAL)
        and (n.endswith("_loss") or n[len(_FUNCTIONAL) :] in _FUNCTIONAL_LOSSES)
        for n in names
    )


def is_loss_module(names: Collection[str]) -> bool:
    """Whether one of these qualified names is a `torch.nn` loss class (`nn.MSELoss`)."""
    return any(n.startswith("torch.nn.") and n.endswith("Loss") for n in names)


def is_detached(value: cst.BaseExpression) -> bool:
    """`x.item()`, `x.detach()`, `x.data`, `float(x)`: no graph in the result."""
    if is_method_call(value):
        return value.func.attr.value in _DETACHING  # type: ignore[attr-defined]
    if is_attribute(value, "data"):
        return True
    return isinstance(value, cst.Call) and is_name(value.func, "float", "int")
