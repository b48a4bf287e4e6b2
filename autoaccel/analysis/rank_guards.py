"""Code that runs on one rank only: `if rank == 0:` blocks and `if rank != 0: return`."""

from __future__ import annotations

import re
from collections.abc import Iterable

import libcst as cst

from autoaccel.analysis.shapes import find, is_attribute, is_name

# `rank`, `RANK`, `args.local_rank`, `dist.get_rank()`, `is_main_process()`, `is_master`.
_RANK_WORD = re.compile(r"rank|(^|_)(main|master|primary|chief)(_|$)", re.I)
# Not about this process's rank: `--to ddp`'s `on_any_rank(condition)` holds on every
# process alike (`stop_together.py`); the `print` under it still needs a guard.
_ON_EVERY_RANK = frozenset({"on_any_rank"})


def names_in(node: cst.CSTNode) -> set[str]:
    """Every plain name used in `node`."""
    return {name.value for name in find(node, cst.Name)}


def mentions_rank(node: cst.CSTNode) -> bool:
    """Whether `node` names the process rank."""
    return any(_RANK_WORD.search(name) for name in names_in(node) - _ON_EVERY_RANK)


def is_rank_exit(statement: cst.CSTNode) -> bool:
    """`if <rank test>: return` (or `continue`, `raise`, `sys.exit()`) with no `else`."""
    if not isinstance(statement, cst.If) or statement.orelse is not None:
        return False
    if not mentions_rank(statement.test):
        return False
    last = statement.body.body[-1]
    if isinstance(last, cst.SimpleStatementLine):
        last = last.body[-1]
    if isinstance(last, cst.Expr) and isinstance(last.value, cst.Call):
        return is_name(last.value.func, "exit") or is_attribute(last.value.func, "exit")
    return isinstance(last, (cst.Return, cst.Continue, cst.Raise))


def rank_guarded(node: cst.CSTNode, ancestors: Iterable[cst.CSTNode]) -> bool:
    """Whether `node` (with its `ancestors`, innermost first) runs on one rank only:
    inside an `if` about the rank (or the chosen side of `x if <rank test> else y`), or
    after an `if <rank test>: return` in its
    function. The search stops at the enclosing function or class."""
    child = node
    for ancestor in ancestors:
        if isinstance(ancestor, cst.If) and child is not ancestor.test:
            if mentions_rank(ancestor.test):
                return True
        if (
            isinstance(ancestor, cst.IfExp)
            and child is ancestor.body
            and mentions_rank(ancestor.test)
        ):
            return True  # `SummaryWriter(...) if RANK == 0 else None`
        if isinstance(ancestor, (cst.IndentedBlock, cst.Module)):
            for statement in ancestor.body:
                if statement is child:
                    break
                if is_rank_exit(statement):
                    return True
        if isinstance(ancestor, (cst.FunctionDef, cst.ClassDef, cst.Lambda)):
            return False
        child = ancestor
    return False
