"""Training loops that take their batches from a function of the project cutting its rows
by slices of a `torch.randperm` (LSTNet's `get_batches(inputs, targets, batch_size)`):
batches of a dataset, shuffled each epoch, that no DataLoader reads."""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst

from autoaccel.analysis.names import name_key
from autoaccel.analysis.program import FunctionInfo
from autoaccel.analysis.script_model import ScriptModel
from autoaccel.analysis.shapes import bound_names, find
from autoaccel.analysis.training import StepLoop

RANDPERM = "torch.randperm"


@dataclass(frozen=True)
class PermutedBatches:
    """A training loop's call of a function that cuts rows by slices of a permutation."""

    call: cst.Call  # `get_batches(train_x, train_y, args.batch_size, True)`
    function: FunctionInfo  # `get_batches`


def permuted_batches(step: StepLoop, script: ScriptModel) -> PermutedBatches | None:
    """The call that the `for` loop `step` takes its batches from (`get_batches(...)`, also
    under `enumerate()`), when the one function of the project it runs slices a
    `torch.randperm`."""
    iterable = step.node.iter if isinstance(step.node, cst.For) else None
    while isinstance(iterable, cst.Call):
        functions = script.callees(iterable)
        if len(functions) == 1:
            (function,) = functions
            if permutation_cuts(function):
                return PermutedBatches(iterable, function)
        iterable = iterable.args[0].value if iterable.args else None
    return None


def randperm_calls(function: FunctionInfo) -> list[cst.Call]:
    index = function.module.index
    return [
        c for c in find(function.node.body, cst.Call) if RANDPERM in index.qualified_names(c.func)
    ]


def permutation_cuts(function: FunctionInfo) -> list[cst.Subscript]:
    """The slices of a permutation in `function`: `index[start:start + batch_size]`, where
    `index = torch.randperm(n) if shuffle else torch.arange(n)`."""
    draws = set(randperm_calls(function))
    permutations = {
        name
        for assign in find(function.node.body, cst.Assign)
        if draws.intersection(find(assign.value, cst.Call))
        for target in assign.targets
        for name in bound_names(target.target)
    }
    return [
        subscript
        for subscript in find(function.node.body, cst.Subscript)
        if name_key(subscript.value) in permutations
        and len(subscript.slice) == 1
        and isinstance(subscript.slice[0].slice, cst.Slice)
    ]
