"""What a transform pass visits, cheaply: the `visit_*` / `leave_*` methods of a
transform class from a table, and the subtrees it can skip.

LibCST looks a node's methods up by name at every node (and finds the no-op methods
its base classes define for every node type), then rebuilds every node of the tree.
A subtree that holds no node with a method of the transform's own comes out of the
pass unchanged: skipping it gives the same code for a fraction of the cost. The module
index of the step's analysis (one walk, done already) tells which subtrees those are."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import libcst as cst

Method = Callable[..., Any]

_METHODS: dict[tuple[type, str, type, str], Method | None] = {}
_HANDLED: dict[type, frozenset[type] | None] = {}

# The node types of the fields the module index leaves out (`index.child_fields`):
# whitespace, brackets, operators and other tokens (`tests/test_convert_dispatch.py`
# derives them from LibCST's type hints).
TOKEN_TYPES = (
    cst.AssignEqual, cst.Asynchronous, cst.BaseAugOp, cst.BaseBinaryOp, cst.BaseBooleanOp,
    cst.BaseCompOp, cst.BaseParenthesizableWhitespace, cst.BaseUnaryOp, cst.Colon, cst.Comma,
    cst.Comment, cst.Dot, cst.EmptyLine, cst.LeftCurlyBrace, cst.LeftParen,
    cst.LeftSquareBracket, cst.Newline, cst.ParamSlash, cst.RightCurlyBrace, cst.RightParen,
    cst.RightSquareBracket, cst.Semicolon, cst.TrailingWhitespace,
)  # fmt: skip


_IS_TOKEN: dict[type, bool] = {}


def is_token(node_type: type) -> bool:
    """Whether nodes of this type are tokens (`TOKEN_TYPES`): they hold tokens only."""
    found = _IS_TOKEN.get(node_type)
    if found is None:
        found = _IS_TOKEN[node_type] = issubclass(node_type, TOKEN_TYPES)
    return found


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


_HOOKS = ("on_visit", "on_leave", "on_visit_attribute", "on_leave_attribute")


def _overrides(cls: type, hook: str) -> bool:
    """Whether a subclass of the transform base overrides LibCST's `hook`."""
    owner = next(klass for klass in cls.__mro__ if hook in vars(klass))
    return owner.__module__ != _BASE_MODULE and not owner.__module__.startswith("libcst")


_BASE_MODULE = "autoaccel.convert.transform"


def _is_libcst_default(function: Method) -> bool:
    # The typed no-op methods LibCST's visitor bases define for every node type.
    return function.__qualname__.startswith("CSTTyped")


_FIELD_HOOKS: dict[type, bool] = {}


def has_field_methods(cls: type) -> bool:
    """Whether `cls` has methods of its own for a field of a node (`visit_Call_args`,
    `leave_Call_func`...), which LibCST calls around every field of every node."""
    found = _FIELD_HOOKS.get(cls)
    if found is None:
        found = _FIELD_HOOKS[cls] = any(
            name.count("_") > 1
            and name.partition("_")[0] in ("visit", "leave")
            and callable(getattr(cls, name))
            and not _is_libcst_default(getattr(cls, name))
            for name in dir(cls)
        )
    return found


def handled_types(cls: type) -> frozenset[type] | None:
    """The node types `cls` has visit or leave methods of its own for (attribute
    methods included), or None where a method names no LibCST node type."""
    if cls in _HANDLED:
        return _HANDLED[cls]
    kinds: set[type] | None = set()
    if any(_overrides(cls, hook) for hook in _HOOKS):
        kinds = None  # a class that sees every node itself
    for name in dir(cls) if kinds is not None else ():
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


def touched_nodes(
    root: cst.Module, parents: Mapping[cst.CSTNode, cst.CSTNode], kinds: frozenset[type]
) -> set[cst.CSTNode] | None:
    """The nodes of `root` that are, or hold, a node of one of `kinds` (`parents`: the
    parent of every node below `root`, tokens and whitespace aside), or None where a
    kind may sit among the tokens (then every node may hold one)."""
    if any(issubclass(kind, TOKEN_TYPES) for kind in kinds):
        return None
    touched: set[cst.CSTNode] = set()
    for node in [root, *parents]:
        if type(node) in kinds:
            while node is not None and node not in touched:
                touched.add(node)
                node = parents.get(node)
    return touched
