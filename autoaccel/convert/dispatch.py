"""What a transform pass visits, cheaply: the `visit_*` / `leave_*` methods of a
transform class from a table, and the subtrees it can skip.

LibCST looks a node's methods up by name at every node (and finds the no-op methods
its base classes define for every node type), then rebuilds every node of the tree.
A subtree that holds no node with a method of the transform's own comes out of the
pass unchanged: skipping it gives the same code for a fraction of the cost."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import libcst as cst

Method = Callable[..., Any]

_METHODS: dict[tuple[type, str, type, str], Method | None] = {}
_HANDLED: dict[type, frozenset[type] | None] = {}
_FIELDS: dict[type, tuple[str, ...]] = {}
_IS_NODE: dict[type, bool] = {}


def method(cls: type, prefix: str, node_type: type, attribute: str = "") -> Method | None:
    """`cls`'s own `visit_Call` / `leave_Call` / `visit_Call_args`... for a node type,
    or None where only LibCST's no-op default exists."""
    key = (cls, prefix, node_type, attribute)
    try:
        return _METHODS[key]
    except KeyError:
        name = f"{prefix}{node_type.__name__}" + (f"_{attribute}" if attribute else "")
        found = getattr(cls, name, None)
        if found is not None and _is_libcst_default(found):
            found = None
        _METHODS[key] = found
        return found


def _is_libcst_default(function: Method) -> bool:
    # The typed no-op methods LibCST's visitor bases define for every node type.
    return function.__qualname__.startswith("CSTTyped")


def handled_types(cls: type) -> frozenset[type] | None:
    """The node types `cls` has visit or leave methods of its own for (attribute
    methods included), or None where a method names no LibCST node type."""
    if cls in _HANDLED:
        return _HANDLED[cls]
    kinds: set[type] | None = set()
    for name in dir(cls):
        prefix, _, rest = name.partition("_")
        if prefix not in ("visit", "leave") or not rest:
            continue
        found = getattr(cls, name)
        if not callable(found) or _is_libcst_default(found):
            continue
        kind = getattr(cst, rest.split("_")[0], None)
        if not (isinstance(kind, type) and issubclass(kind, cst.CSTNode)):
            kinds = None  # a name we cannot map to a node type: visit everything
            break
        kinds.add(kind)
    _HANDLED[cls] = result = frozenset(kinds) if kinds is not None else None
    return result


def untouched_subtrees(module: cst.Module, kinds: frozenset[type]) -> set[cst.CSTNode]:
    """The topmost nodes of `module` under which (themselves included) no node has one
    of the types `kinds`: a pass whose methods handle only those types may skip them."""
    skipped: set[cst.CSTNode] = set()

    def holds(node: cst.CSTNode) -> bool:
        """Whether `node` or a node below it is of `kinds`; topmost misses noted."""
        found = type(node) in kinds
        missed = []
        for child in _children(node):
            if holds(child):
                found = True
            else:
                missed.append(child)
        if found:
            skipped.update(missed)
        return found

    if not holds(module):
        skipped.add(module)
    return skipped


def _children(node: cst.CSTNode) -> list[cst.CSTNode]:
    """Every child node, whitespace and tokens included (all LibCST visits)."""
    kind = type(node)
    fields = _FIELDS.get(kind)
    if fields is None:
        fields = _FIELDS[kind] = tuple(f.name for f in dataclasses.fields(kind))
    found = []
    for name in fields:
        value = getattr(node, name)
        value_type = type(value)
        if value_type is tuple or value_type is list:
            found += [item for item in value if _is_node(type(item))]
        elif _is_node(value_type):
            found.append(value)
    return found


def _is_node(kind: type) -> bool:
    # `isinstance(x, cst.CSTNode)` runs ABCMeta's Python code for every field value.
    known = _IS_NODE.get(kind)
    if known is None:
        known = _IS_NODE[kind] = issubclass(kind, cst.CSTNode)
    return known
