"""A set is read in sorted order wherever its order makes something.

`chars = list(set(text))` then `{c: i for i, c in enumerate(chars)}`: char-RNN scripts
number their vocabulary in the order of a set of strings. Python orders strings by hash,
and hashes are seeded at random in each process (`PYTHONHASHSEED`, unset under torchrun):
every process would number the characters differently, and one model would train on
data each process encodes its own way, with no error anywhere. Where a set (`set(...)`,
`frozenset(...)`, a set comprehension, or a name bound only to one) is turned into a
sequence (`list`, `tuple`, `enumerate`, `str.join`) or iterated by a `for`, it is read
as `sorted(...)`: the same order in every process (`list(set(text))` becomes
`sorted(set(text))`). Elements that cannot be compared raise a `TypeError` at that line
rather than train wrongly.
"""

from __future__ import annotations

from collections.abc import Iterator

import libcst as cst

from autoaccel.analysis.names import name_key
from autoaccel.analysis.shapes import find
from autoaccel.convert.transforms.distributed._base import DistributedStep
from autoaccel.cst_edit import code_of

_SETS = frozenset({"builtins.set", "builtins.frozenset"})
# Calls whose result keeps the order of the iterable given first.
_SEQUENCES = frozenset({"builtins.list", "builtins.tuple", "builtins.enumerate"})
_SORTED = frozenset({"builtins.sorted"})
# Methods of a module that give its tensors or submodules.
_MODEL_TENSORS = frozenset({"parameters", "named_parameters", "buffers", "modules", "children"})


class OrderSetsAlike(DistributedStep):
    DESCRIPTION = "Read sets in sorted order where their order makes a sequence."
    needs = ("set",)

    def visit_Module(self, node: cst.Module) -> None:
        # a `list(...)` call -> True (it becomes `sorted(...)`), an iterable -> False
        # (wrapped in `sorted(...)`)
        self.sorted_reads: dict[cst.CSTNode, bool] = {}
        set_names = self._set_names(node)
        for read, made in self._ordered_reads(node):
            if not self._is_set(read, set_names) or self._under_sorted(made):
                continue
            renamed = isinstance(made, cst.Call) and bool(
                self.qualified_names(made.func) & {"builtins.list"}
            )
            self.sorted_reads[made if renamed else read] = renamed
            self.changed(
                made,
                f"`{code_of(read)}` read in sorted order: Python orders a set of strings by"
                " hash, seeded differently in each process; sorted, every process gets the"
                " same order",
            )

    def _ordered_reads(
        self, module: cst.Module
    ) -> Iterator[tuple[cst.BaseExpression, cst.CSTNode]]:
        """Each iterable whose order the code keeps, with the expression that keeps it:
        the first argument of `list(...)`, `enumerate(...)`..., of `", ".join(...)`, and
        what a `for` (a statement or a comprehension's) iterates."""
        for call in find(module, cst.Call):
            if not call.args or call.args[0].keyword is not None or call.args[0].star:
                continue
            func = call.func
            joins = (
                isinstance(func, cst.Attribute)
                and func.attr.value == "join"
                and isinstance(func.value, (cst.SimpleString, cst.ConcatenatedString))
            )
            if joins or self.qualified_names(func) & _SEQUENCES:
                yield call.args[0].value, call
        for loop in find(module, cst.For):
            yield loop.iter, loop
        for clause in find(module, cst.CompFor):
            yield clause.iter, clause

    def _set_names(self, module: cst.Module) -> set[str]:
        """The names every assignment of the module binds to a set."""
        bound: dict[str, bool] = {}
        for assign in find(module, cst.Assign):
            for target in assign.targets:
                key = name_key(target.target)
                if key is not None:
                    bound[key] = bound.get(key, True) and self._makes_set(assign.value)
        others: list[cst.AugAssign | cst.AnnAssign] = [
            *find(module, cst.AugAssign),
            *find(module, cst.AnnAssign),
        ]
        for other in others:
            key = name_key(other.target)
            if key is not None:
                bound[key] = False
        return {name for name, is_set in bound.items() if is_set}

    def _is_set(self, node: cst.BaseExpression, set_names: set[str]) -> bool:
        return self._makes_set(node) or name_key(node) in set_names

    def _makes_set(self, node: cst.BaseExpression) -> bool:
        """Whether `node` makes a set, of values other than a model's tensors (those hash
        by identity: no order of them is the same in two processes, nor comparable)."""
        if isinstance(node, cst.Call) and not self.qualified_names(node.func) & _SETS:
            return False
        if not isinstance(node, (cst.Call, cst.SetComp, cst.Set)):
            return False
        return not any(
            isinstance(call.func, cst.Attribute) and call.func.attr.value in _MODEL_TENSORS
            for call in find(node, cst.Call)
        )

    def _under_sorted(self, node: cst.CSTNode) -> bool:
        """Whether `node` is the iterable of a `sorted(...)` already."""
        arg = self.parent(node)
        call = self.parent(arg) if isinstance(arg, cst.Arg) else None
        return isinstance(call, cst.Call) and bool(self.qualified_names(call.func) & _SORTED)

    def edited(self) -> list[cst.CSTNode]:
        return list(self.sorted_reads)

    def _sorted(self, original: cst.CSTNode, updated: cst.BaseExpression) -> cst.BaseExpression:
        renamed = self.sorted_reads.get(original)
        if renamed is None:
            return updated
        if renamed and isinstance(updated, cst.Call):
            return updated.with_changes(func=cst.Name("sorted"))
        return cst.Call(cst.Name("sorted"), [cst.Arg(updated)])

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        return self._sorted(original_node, updated_node)

    def leave_Name(self, original_node: cst.Name, updated_node: cst.Name) -> cst.BaseExpression:
        return self._sorted(original_node, updated_node)

    def leave_Attribute(
        self, original_node: cst.Attribute, updated_node: cst.Attribute
    ) -> cst.BaseExpression:
        return self._sorted(original_node, updated_node)

    def leave_SetComp(
        self, original_node: cst.SetComp, updated_node: cst.SetComp
    ) -> cst.BaseExpression:
        return self._sorted(original_node, updated_node)

    def leave_Set(self, original_node: cst.Set, updated_node: cst.Set) -> cst.BaseExpression:
        return self._sorted(original_node, updated_node)
