"""Which code runs on every step: the body of a step loop, and the functions that every
call of the program runs from one (`for epoch in range(n): train(epoch)` where `train()`
does one full-batch step; `cal_performance(pred, gold)` called from the step loop).

A line under an `if` that holds on some steps only (a logging interval such as
`step % 100 == 0`, or a switch for measuring such as `args.profile`) does not run on
every step; nor does a loop's `else:` or header, an `except` block, a lambda or a class
body. A function runs on every step when one of its calls does; it runs *only* there
when every call of the program does (a timing helper also called at set-up does not).
"""

from __future__ import annotations

import re

import libcst as cst

from autoaccel.analysis.index import ModuleIndex
from autoaccel.analysis.names import name_key
from autoaccel.analysis.program import FunctionInfo, Program
from autoaccel.analysis.shapes import find, is_binary
from autoaccel.analysis.training import LoopRole, Training

# Names that count steps, for `if step % 100 == 0:` / `if batch_idx > 0:` gates.
COUNTER_NAME = re.compile(r"^(?:i|j|n|t|it)$|step|iter|idx|batch|count", re.I)
# An `if` on a switch for measuring or debugging (`if args.profile:`) is opt-in.
_MEASURING_SWITCH = re.compile(r"profil|bench|debug|timing|timer|verbose|sync", re.I)
Steps = tuple[LoopRole | None, bool]
NEVER: Steps = (None, False)


def is_interval(test: cst.BaseExpression, counters: set[str]) -> bool:
    """`step % 100 == 0`, `i == len(loader) - 1`, `batch_idx > 0 and ...`."""
    if any(is_binary(node, cst.Modulo) for node in find(test, cst.BinaryOperation)):
        return True
    for comparison in find(test, cst.Comparison):
        operands = [comparison.left] + [c.comparator for c in comparison.comparisons]
        for operand in operands:
            key = name_key(operand)
            if key is not None and (key in counters or COUNTER_NAME.search(key.split(".")[-1])):
                return True
    return False


def sometimes(test: cst.BaseExpression) -> bool:
    """An `if` test that holds on some steps only: a logging interval (`step % 100 == 0`)
    or a switch for measuring (`args.profile`, `self.debug`)."""
    return is_interval(test, set()) or any(
        _MEASURING_SWITCH.search(name.value) for name in find(test, cst.Name)
    )


class StepRuns:
    """Answers "does this node run on every step?" for the nodes of a program (see the
    module docstring); what it finds for a function is kept."""

    def __init__(self, program: Program, training: Training) -> None:
        self.program = program
        self.training = training
        self._functions: dict[FunctionInfo, Steps] = {}
        self._callers: dict[FunctionInfo, list[cst.Call]] | None = None

    def steps(
        self, node: cst.CSTNode, index: ModuleIndex, seen: frozenset[FunctionInfo] = frozenset()
    ) -> Steps:
        """The role of a step loop that runs `node` (a node of a module of the program,
        walked with that module's `index`) on every iteration, None when none does; and
        whether `node` runs only there (not also from other callers of its function)."""
        step_loops = self.training.step_loops
        child = node
        for ancestor in index.ancestors(node):
            loop = step_loops.get(ancestor)
            if loop is not None:
                # Its body runs every step; its `else:` and its header do not.
                return (loop.role, True) if child is ancestor.body else NEVER
            if isinstance(ancestor, cst.If) and child is ancestor.body and sometimes(ancestor.test):
                return NEVER
            if isinstance(
                ancestor, (cst.ExceptHandler, cst.ExceptStarHandler, cst.Lambda, cst.ClassDef)
            ):
                return NEVER  # after a failure, or code that is only defined here
            if isinstance(ancestor, cst.FunctionDef):
                function = self.program.functions.get(ancestor)
                return NEVER if function is None else self.function_steps(function, seen)
            child = ancestor
        return NEVER

    def function_steps(
        self, function: FunctionInfo, seen: frozenset[FunctionInfo] = frozenset()
    ) -> Steps:
        """`steps` of the body of `function`, from its calls (training first)."""
        if function in seen:
            return NEVER
        if function not in self._functions:
            seen = seen | {function}
            found = [
                self.steps(call, self.program.module_of[call].index, seen)
                for call in self.callers().get(function, ())
            ]
            roles = {role for role, _ in found}
            role = next((r for r in (LoopRole.TRAIN, LoopRole.EVAL) if r in roles), None)
            self._functions[function] = (role, all(r is not None and only for r, only in found))
        return self._functions[function]

    def callers(self) -> dict[FunctionInfo, list[cst.Call]]:
        """The calls of the program that may run each function (built when first needed)."""
        if self._callers is None:
            self._callers = {}
            for call, functions in self.program.callees.items():
                for function in functions:
                    self._callers.setdefault(function, []).append(call)
        return self._callers
