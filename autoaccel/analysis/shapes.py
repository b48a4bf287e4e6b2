"""Small structural tests and searches on LibCST nodes.

What rules used `libcst.matchers` for on the lint path: importing the matchers costs
~0.3 s of start-up, more than linting a typical script (`pre-commit` pays it on
every commit), and these plain checks are also faster per call. Convert steps search
with them too: each `m.findall` is a full LibCST visitor pass.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache
from typing import TypeVar

import libcst as cst

from autoaccel.analysis.index import descendants
from autoaccel.analysis.names import name_key

NodeT = TypeVar("NodeT", bound=cst.CSTNode)
# The context managers under which no gradient is recorded.
NO_GRAD = frozenset({"torch.no_grad", "torch.inference_mode"})


def is_name(node: cst.CSTNode | None, *values: str) -> bool:
    """`node` is a plain name, one of `values` when given."""
    return isinstance(node, cst.Name) and (not values or node.value in values)


def is_true(node: cst.CSTNode | None) -> bool:
    """The literal `True`."""
    return is_name(node, "True")


def is_false(node: cst.CSTNode | None) -> bool:
    """The literal `False`."""
    return is_name(node, "False")


def is_attribute(node: cst.CSTNode | None, *attributes: str) -> bool:
    """`x.attr` with `attr` one of `attributes` (any when none are given)."""
    return isinstance(node, cst.Attribute) and (not attributes or node.attr.value in attributes)


def tuple_items(value: cst.BaseExpression) -> list[cst.BaseExpression]:
    """The elements of a tuple display (`return x, y`, `isinstance(m, (A, B))`), or the one
    value that is none."""
    if isinstance(value, cst.Tuple):
        return [e.value for e in value.elements]
    return [value]


def is_no_grad_block(
    node: cst.CSTNode, qualified_names: Callable[[cst.CSTNode], frozenset[str]]
) -> bool:
    """`with torch.no_grad():` (or `torch.inference_mode()`), its names resolved by
    `qualified_names`."""
    return isinstance(node, cst.With) and any(
        isinstance(item.item, cst.Call) and qualified_names(item.item.func) & NO_GRAD
        for item in node.items
    )


def is_method_call(node: cst.CSTNode | None, *methods: str) -> bool:
    """`x.method(...)` with `method` one of `methods` (any when none are given)."""
    return isinstance(node, cst.Call) and is_attribute(node.func, *methods)


def is_binary(node: cst.CSTNode | None, operator: type[cst.BaseBinaryOp]) -> bool:
    """`a <op> b` for the given operator class (`cst.Add`, `cst.Modulo`)."""
    return isinstance(node, cst.BinaryOperation) and isinstance(node.operator, operator)


def find(node: cst.CSTNode, kind: type[NodeT] | tuple[type[NodeT], ...]) -> list[NodeT]:
    """Every node of type `kind` in `node` (itself included), in source order."""
    if isinstance(node, cst.Module):  # asked again and again by the steps of a conversion
        return list(_found_in_module(node, kind))
    return [found for found in descendants(node) if isinstance(found, kind)]  # type: ignore[misc]


@lru_cache(maxsize=512)
def _found_in_module(module: cst.Module, kind: type | tuple[type, ...]) -> tuple[cst.CSTNode, ...]:
    return tuple(found for found in _nodes_of(module) if isinstance(found, kind))


@lru_cache(maxsize=16)
def _nodes_of(module: cst.Module) -> tuple[cst.CSTNode, ...]:
    """Every node of `module` (trees are immutable: the walk is done once)."""
    return tuple(descendants(module))


def method_calls(node: cst.CSTNode, *methods: str) -> list[cst.Call]:
    """Every `x.method(...)` call in `node`, in source order."""
    return [call for call in find(node, cst.Call) if is_attribute(call.func, *methods)]


def name_calls(node: cst.CSTNode, *names: str) -> list[cst.Call]:
    """Every `name(...)` call in `node` with `name` one of `names`, in source order."""
    return [c for c in find(node, cst.Call) if is_name(c.func, *names)]


def called_function(node: cst.CSTNode, functions: set[str]) -> str | None:
    """The first of `functions` that `node` calls, as `f(...)` or `self.f(...)`."""
    for call in find(node, cst.Call):
        key = (name_key(call.func) or "").removeprefix("self.")
        if key in functions:
            return key
    return None


def bound_names(target: cst.BaseExpression) -> list[str]:
    """The plain names an assignment or `for` target binds: `x`, `(x, y)`, `[x, *rest]`."""
    return [name.value for name in bound_name_nodes(target)]


def bound_name_nodes(target: cst.BaseExpression) -> list[cst.Name]:
    """`bound_names`, as the `Name` nodes of the target."""
    if isinstance(target, cst.Name):
        return [target]
    if isinstance(target, (cst.Tuple, cst.List)):
        return [n for element in target.elements for n in bound_name_nodes(element.value)]
    if isinstance(target, cst.StarredElement):
        return bound_name_nodes(target.value)
    return []


class BindingVisitor:
    """Mixin for visitors: `bind(target, value)` for every `a = b` and `a: T = b`."""

    def visit_Assign(self, node: cst.Assign) -> None:
        for target in node.targets:
            self.bind(target.target, node.value)

    def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
        if node.value is not None:
            self.bind(node.target, node.value)

    def bind(self, target: cst.BaseExpression, value: cst.BaseExpression) -> None:
        raise NotImplementedError
