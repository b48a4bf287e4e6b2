"""Which DataLoader a helper's flag selects (melgan's `create_dataloader(hp, args, train)`):
`make_loader(data, train)` returns one DataLoader under `if train:` and another one
otherwise. The program's values are the same for every call of the helper, both loaders,
so a training loop that reads `make_loader(train_set, True)` reads both by them; but a call
that passes a literal `True` or `False` gets one of them only. `unselected_loaders` names the
loaders no training loop gets, through the calls its batches come from.

A factory that makes every split's loader in one call (LTSF-Linear's `data_provider(args,
flag)` with `flag="train"`, `"val"`, `"test"`) is the same case without branches:
`training_splits` names the parameter whose literal the training loops' calls all pass,
where another call passes something else.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeVar

import libcst as cst

from autoaccel.analysis.loss_reduction import assigned_values, reaching_values
from autoaccel.analysis.program import FunctionInfo, Kind, Obj, Program, SourceModule, argument
from autoaccel.analysis.script_model import LoopRole, ScriptModel
from autoaccel.analysis.shapes import find, is_name
from autoaccel.analysis.training import StepLoop

_UNKNOWN = object()  # the value of an expression that is not a literal

_Item = TypeVar("_Item")


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
    found: dict[cst.Call, Flag] = {}
    for loader, loops in training_readers(script).items():
        flag = selecting_flag(loader, program)
        if (
            isinstance(loader.node, cst.Call)
            and flag is not None
            and all(_selects_other(loop, flag, program) for loop in loops)
        ):
            found[loader.node] = flag
    return found


@dataclass(frozen=True)
class Split:
    """`function` makes the training loops' loader where its parameter `name` is `value`
    (the literal they pass), and another loader where a call passes something else."""

    function: FunctionInfo
    name: str
    value: cst.BaseExpression


def training_splits(script: ScriptModel) -> dict[cst.Call, Split]:
    """The DataLoader calls of `script`'s module, each in a function whose every call the
    training loops read passes one literal for a parameter (`flag="train"`), while another
    call passes something else (`flag="val"`), with that parameter and literal."""
    program = script.program
    found: dict[cst.Call, Split] = {}
    if program is None:
        return found
    for loader, loops in training_readers(script).items():
        function = program.function_of.get(loader.node)
        if function is None or not isinstance(loader.node, cst.Call):
            continue
        branch = selecting_flag(loader, program)  # `if train: return DataLoader(...)`
        for name in [p for p in _parameters(function) if branch is None or p != branch.name]:
            flag = Flag(function, name, True)
            read = _joined([_values_read(loop, flag, program) for loop in loops])
            values = {_constant(v) for v in read or ()}
            if not read or len(values) != 1 or _UNKNOWN in values:
                continue
            if assigned_values(function.node, name):
                continue
            if any(_constant(v) not in values for v in _passed_anywhere(flag, program)):
                found[loader.node] = Split(function, name, read[0])
                break
    return found


def training_readers(script: ScriptModel) -> dict[Obj, list[StepLoop]]:
    """The loaders of `script`'s module that training loops read, with those loops."""
    readers: dict[Obj, list[StepLoop]] = {}
    for loop in script.training.step_loops.values():
        if loop.role is LoopRole.TRAIN:
            for loader in loop.loaders:
                if loader.module is script.module:
                    readers.setdefault(loader, []).append(loop)
    return readers


def _passed_anywhere(
    flag: Flag, program: Program, seen: frozenset[FunctionInfo] = frozenset()
) -> list[cst.BaseExpression | None]:
    """What each call of `flag.function` in the program passes for `flag.name`, through
    the calls of a function that passes its own parameter on (`_get_data(self, flag)`)."""
    found: list[cst.BaseExpression | None] = []
    for call in program.calls_of(flag.function):
        value = _passed(call, flag)
        caller = program.function_of.get(call)
        outer = _forwarded(value, caller)
        if outer is None or caller is None or caller in seen:
            found.append(value)
        else:
            found += _passed_anywhere(
                Flag(caller, outer, flag.value), program, seen | {flag.function}
            )
    return found


def _forwarded(value: cst.BaseExpression | None, function: FunctionInfo | None) -> str | None:
    """The name of `function`'s parameter `value` reads, where `function` never assigns it."""
    if function is None or not isinstance(value, cst.Name):
        return None
    name = value.value
    forwarded = name in _parameters(function) and not assigned_values(function.node, name)
    return name if forwarded else None


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
    values = _values_read(loop, flag, program)
    return bool(values) and all(_constant(v) is (not flag.value) for v in values or ())


def _values_read(loop: StepLoop, flag: Flag, program: Program) -> list[cst.BaseExpression] | None:
    """What the calls of `flag.function` that `loop` takes its batches from pass for
    `flag.name`; None where the analysis cannot tell."""
    module, node = loop.module, loop.node
    if not isinstance(node, cst.For) or module is None:
        return None
    return _read(node.iter, module, loop.function, flag, program)


def _read(
    node: cst.CSTNode,
    module: SourceModule,
    function: FunctionInfo | None,
    flag: Flag,
    program: Program,
    seen: frozenset[FunctionInfo] = frozenset(),
) -> list[cst.BaseExpression] | None:
    """What the calls of `flag.function` whose result `node` (of `module`, in `function`)
    holds pass for `flag.name`, back through assignments, parameters, wrappers
    (`tqdm(loader)`) and functions that return such a call's loader (`_get_data(flag)`);
    None where a value comes from anything else."""
    if isinstance(node, cst.Call):
        callees = program.callees.get(node, set())
        if flag.function in callees:
            value = _passed(node, flag)
            return None if value is None else [value]
        if callees:  # another function of the project: what it returns
            return _returned(node, callees, flag, program, seen)
        wrapped = [  # `tqdm(loader)`, `itertools.chain(train_loader, val_loader)`
            a.value for a in node.args if _holds_loader(a.value, module, program)
        ]
        inner = [_read(w, module, function, flag, program, seen) for w in wrapped]
        return _joined(inner) if wrapped else None
    if isinstance(node, cst.Tuple):  # `return data_set, data_loader`
        elements = [e.value for e in node.elements if _holds_loader(e.value, module, program)]
        return _joined([_read(e, module, function, flag, program, seen) for e in elements])
    if not isinstance(node, cst.Name):
        return None
    scope = function.node if function is not None else module.tree
    values = reaching_values(node, scope, module.index) or _unpacked(scope, node.value)
    if values:  # (an augmented assignment is no call: None)
        return _joined([_read(v, module, function, flag, program, seen) for v in values])
    if function is None or function in seen or node.value not in _parameters(function):
        return None
    found: list[cst.BaseExpression] = []
    for call in program.calls_of(function):
        passed_value = _argument(call, function, node.value)
        caller = program.function_of.get(call)
        read = (
            None
            if passed_value is None
            else _read(
                passed_value, program.module_of[call], caller, flag, program, seen | {function}
            )
        )
        if read is None:
            return None
        found += read
    return found or None


def _returned(
    call: cst.Call,
    callees: set[FunctionInfo],
    flag: Flag,
    program: Program,
    seen: frozenset[FunctionInfo],
) -> list[cst.BaseExpression] | None:
    """What the loaders `call`'s one function returns are passed for `flag.name`, a
    parameter of that function it passes on read as `call` passes it."""
    (function,) = callees if len(callees) == 1 else (None,)
    if function is None or function in seen:
        return None
    module = function.module
    returns = [
        r.value
        for r in _own_returns(function)
        if r.value is not None and _holds_loader(r.value, module, program)
    ]
    read = _joined([_read(r, module, function, flag, program, seen | {function}) for r in returns])
    if not read:
        return None
    found: list[cst.BaseExpression] = []
    for value in read:
        name = _forwarded(value, function)
        outer = value if name is None else _passed(call, Flag(function, name, flag.value))
        if outer is None:
            return None
        found.append(outer)
    return found


def _own_returns(function: FunctionInfo) -> list[cst.Return]:
    """The `return` statements of `function`, not of the functions defined in it."""
    index = function.module.index
    return [
        r
        for r in find(function.node.body, cst.Return)
        if next(a for a in index.ancestors(r) if isinstance(a, (cst.FunctionDef, cst.Lambda)))
        is function.node
    ]


def _unpacked(scope: cst.CSTNode, name: str) -> list[cst.BaseExpression]:
    """The values `scope` unpacks into `name` and other names: `data_set, loader = f()`."""
    return [
        node.value
        for node in find(scope, cst.Assign)
        for target in node.targets
        if isinstance(target.target, cst.Tuple)
        and not isinstance(node.value, cst.Tuple)
        and any(is_name(e.value, name) for e in target.target.elements)
    ]


def _holds_loader(node: cst.BaseExpression, module: SourceModule, program: Program) -> bool:
    return any(o.kind is Kind.LOADER for o in program.flat_values_of(node, module))


def _joined(found: list[list[_Item] | None]) -> list[_Item] | None:
    """All the items of the lists `found`, or None where one of them is None."""
    items: list[_Item] = []
    for item in found:
        if item is None:
            return None
        items += item
    return items


def _passed(call: cst.Call, flag: Flag) -> cst.BaseExpression | None:
    """What `call` passes for `flag.name` (its default where it passes none); None where
    it passes `*args` or `**kwargs`."""
    if any(a.star for a in call.args):
        return None
    value = _argument(call, flag.function, flag.name)
    return _parameters(flag.function)[flag.name].default if value is None else value


def _constant(value: cst.BaseExpression | None) -> object:
    """The value of a literal (`True`, `"train"`, `0`); `_UNKNOWN` for anything else."""
    if isinstance(value, (cst.SimpleString, cst.Integer, cst.Float)):
        return value.evaluated_value
    names = {"True": True, "False": False, "None": None}
    return names.get(value.value, _UNKNOWN) if isinstance(value, cst.Name) else _UNKNOWN


def _argument(call: cst.Call, function: FunctionInfo, name: str) -> cst.BaseExpression | None:
    positional = function.positional[1:] if function.is_method else function.positional
    position = positional.index(name) if name in positional else len(call.args)
    return argument(call, position, name)
