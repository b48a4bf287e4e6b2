"""Which DataLoader a helper's flag selects (melgan's `create_dataloader(hp, args, train)`):
`make_loader(data, train)` returns one DataLoader under `if train:` and another one
otherwise. The program's values are the same for every call of the helper, both loaders,
so a training loop that reads `make_loader(train_set, True)` reads both by them; but a call
that passes a literal `True` or `False` gets one of them only. `unselected_loaders` names the
loaders no training loop gets, through the calls its batches come from.
"""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst

from autoaccel.analysis.loss_reduction import assigned_values, reaching_values
from autoaccel.analysis.program import FunctionInfo, Kind, Obj, Program, SourceModule, argument
from autoaccel.analysis.script_model import LoopRole, ScriptModel
from autoaccel.analysis.training import StepLoop


@dataclass(frozen=True)
class Flag:
    """`function` makes a loader only where its parameter `name` is `value`."""

    function: FunctionInfo
    name: str
    value: bool


def unselected_loaders(script: ScriptModel) -> dict[cst.Call, Flag]:
    """The DataLoader calls of `script`'s module that the training loops read by the
    program's values, but that every call of its helper they take their batches from
    passes the flag of another branch to (each with that flag)."""
    program = script.program
    if program is None:
        return {}
    readers: dict[Obj, list[StepLoop]] = {}
    for loop in script.training.step_loops.values():
        if loop.role is LoopRole.TRAIN:
            for loader in loop.loaders:
                if loader.module is script.module:
                    readers.setdefault(loader, []).append(loop)
    found: dict[cst.Call, Flag] = {}
    for loader, loops in readers.items():
        flag = selecting_flag(loader, program)
        if (
            isinstance(loader.node, cst.Call)
            and flag is not None
            and all(_selects_other(loop, flag, program) for loop in loops)
        ):
            found[loader.node] = flag
    return found


def selecting_flag(loader: Obj, program: Program) -> Flag | None:
    """The parameter of the function making `loader` whose truth decides that it is made:
    in the body of `if train:` (or `if not train:`), in its `else:`, or after an `if train:`
    whose body ends in a `return`."""
    function = program.function_of.get(loader.node)
    if function is None:
        return None
    child: cst.CSTNode = loader.node
    for ancestor in loader.module.index.ancestors(loader.node):
        if ancestor is function.node:
            return None
        if isinstance(ancestor, cst.If) and child is not ancestor.test:
            tested = _tested_flag(ancestor.test, function)
            if tested is not None and isinstance(child, (cst.IndentedBlock, cst.Else)):
                name, value = tested
                return Flag(function, name, value if child is ancestor.body else not value)
        if isinstance(ancestor, cst.IndentedBlock) and child in ancestor.body:
            for before in ancestor.body[: ancestor.body.index(child)]:
                tested = _returning_if(before, function)
                if tested is not None:
                    return Flag(function, tested[0], not tested[1])
        child = ancestor
    return None


def _returning_if(statement: cst.CSTNode, function: FunctionInfo) -> tuple[str, bool] | None:
    """The flag of `if train: ... return x` with no `else` (what follows runs otherwise)."""
    if not isinstance(statement, cst.If) or statement.orelse is not None:
        return None
    last = statement.body.body[-1] if statement.body.body else None
    returns = isinstance(last, cst.SimpleStatementLine) and isinstance(
        last.body[-1], (cst.Return, cst.Raise)
    )
    return _tested_flag(statement.test, function) if returns else None


def _tested_flag(test: cst.BaseExpression, function: FunctionInfo) -> tuple[str, bool] | None:
    """`("train", True)` for `train`, `("train", False)` for `not train`: a parameter of
    `function` that it never assigns."""
    value = True
    if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
        test, value = test.expression, False
    if not isinstance(test, cst.Name) or test.value not in _parameters(function):
        return None
    return (test.value, value) if not assigned_values(function.node, test.value) else None


def _parameters(function: FunctionInfo) -> dict[str, cst.Param]:
    params = function.node.params
    return {
        p.name.value: p for p in (*params.posonly_params, *params.params, *params.kwonly_params)
    }


def _selects_other(loop: StepLoop, flag: Flag, program: Program) -> bool:
    """Whether every call of `flag`'s function that `loop` takes its batches from passes
    the literal opposite of `flag.value`."""
    module, node = loop.module, loop.node
    calls = (
        _calls_read(node.iter, module, loop.function, flag, program)
        if isinstance(node, cst.For) and module is not None
        else None
    )
    return bool(calls) and all(passed(call, flag) is (not flag.value) for call in calls or ())


def _calls_read(
    node: cst.BaseExpression | cst.AugAssign,
    module: SourceModule,
    function: FunctionInfo | None,
    flag: Flag,
    program: Program,
    seen: frozenset[FunctionInfo] = frozenset(),
) -> list[cst.Call] | None:
    """The calls of `flag.function` whose result `node` (of `module`, in `function`) holds,
    back through assignments, parameters and wrappers (`tqdm(loader)`); None where a value
    comes from anything else."""
    if isinstance(node, cst.Call):
        if flag.function in program.callees.get(node, ()):
            return [node]
        if program.callees.get(node):
            return None  # another function of the project: what it returns is not followed
        wrapped = [  # `tqdm(loader)`, `itertools.chain(train_loader, val_loader)`
            a.value
            for a in node.args
            if any(o.kind is Kind.LOADER for o in program.flat_values_of(a.value, module))
        ]
        inner = [_calls_read(w, module, function, flag, program, seen) for w in wrapped]
        return _joined(inner) if wrapped else None
    if not isinstance(node, cst.Name):
        return None
    scope = function.node if function is not None else module.tree
    values = reaching_values(node, scope, module.index)
    if values:  # (an augmented assignment is no call: None)
        return _joined([_calls_read(v, module, function, flag, program, seen) for v in values])
    if function is None or function in seen or node.value not in _parameters(function):
        return None
    found: list[cst.Call] = []
    for call in program.calls_of(function):
        passed_value = _argument(call, function, node.value)
        caller = program.function_of.get(call)
        calls = (
            None
            if passed_value is None
            else _calls_read(
                passed_value, program.module_of[call], caller, flag, program, seen | {function}
            )
        )
        if calls is None:
            return None
        found += calls
    return found or None


def _joined(found: list[list[cst.Call] | None]) -> list[cst.Call] | None:
    """All the calls `found`, or None where one of its lists is None."""
    calls: list[cst.Call] = []
    for item in found:
        if item is None:
            return None
        calls += item
    return calls


def passed(call: cst.Call, flag: Flag) -> bool | None:
    """The literal `True` or `False` `call` passes for `flag` (its default where it passes
    none); None for anything else."""
    if any(a.star for a in call.args):
        return None
    value = _argument(call, flag.function, flag.name)
    if value is None:
        value = _parameters(flag.function)[flag.name].default
    return {"True": True, "False": False}.get(value.value) if isinstance(value, cst.Name) else None


def _argument(call: cst.Call, function: FunctionInfo, name: str) -> cst.BaseExpression | None:
    positional = function.positional[1:] if function.is_method else function.positional
    position = positional.index(name) if name in positional else len(call.args)
    return argument(call, position, name)
