"""Where a script wraps a model in `nn.DataParallel` itself (`model = nn.DataParallel(model)`)."""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst

from autoaccel.analysis.names import name_key
from autoaccel.analysis.script_model import DATA_PARALLEL, strip_device_moves
from autoaccel.analysis.shapes import find, name_calls
from autoaccel.convert.transform import Transform

WRAPPER_CLASS = "ModelWithLoss"
# The wrapper of a step's own lines (see `step_segments`): `LossInForward(compute, *modules)`.
GENERAL_CLASS = "LossInForward"


@dataclass(frozen=True)
class Wrap:
    """`key = nn.DataParallel(module, ...)`, possibly followed by `.to(...)` / `.cuda()`."""

    statement: cst.SimpleStatementLine
    key: str  # name_key of the name bound to the wrapper
    call: cst.Call  # the `nn.DataParallel(...)` call

    @property
    def only_wraps(self) -> bool:
        """Whether the call passes nothing but the module (no `device_ids`, `dim`, ...)."""
        return single_positional(self.call)


def single_positional(call: cst.Call) -> bool:
    """Whether `call` passes exactly one argument, by position."""
    return len(call.args) == 1 and call.args[0].keyword is None and not call.args[0].star


def single_assign(statement: cst.CSTNode) -> tuple[cst.BaseExpression, cst.BaseExpression] | None:
    """`(target, value)` of a line holding exactly one `target = value`."""
    if not (isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1):
        return None
    assign = statement.body[0]
    if isinstance(assign, cst.Assign) and len(assign.targets) == 1:
        return assign.targets[0].target, assign.value
    return None


def data_parallel_wraps(transform: Transform, module: cst.Module) -> list[Wrap]:
    wraps = []
    for statement in find(module, cst.SimpleStatementLine):
        assign = single_assign(statement)
        if assign is None:
            continue
        key = name_key(assign[0])
        value = strip_device_moves(assign[1])
        if (
            key
            and isinstance(value, cst.Call)
            and DATA_PARALLEL in transform.qualified_names(value.func)
        ):
            wraps.append(Wrap(statement, key, value))  # type: ignore[arg-type]
    return wraps


def aliases(keys: set[str], module: cst.Module) -> set[str]:
    """`keys` and every name assigned from one of them (`self.model = model`)."""
    pairs = []
    for statement in find(module, cst.SimpleStatementLine):
        assign = single_assign(statement)
        if assign is not None:
            target, source = name_key(assign[0]), name_key(strip_device_moves(assign[1]))
            if target and source:
                pairs.append((target, source))
    found = set(keys)
    grew = True
    while grew:
        grew = False
        for target, source in pairs:
            if source in found and target not in found:
                found.add(target)
                grew = True
    return found


def wrapper_instances(module: cst.Module) -> set[str]:
    """Names bound to a `ModelWithLoss(...)` (or a DataParallel of one): the converted calls."""
    created = set()
    for statement in find(module, cst.SimpleStatementLine):
        assign = single_assign(statement)
        if assign is not None and name_calls(assign[1], WRAPPER_CLASS, GENERAL_CLASS):
            key = name_key(assign[0])
            if key:
                created.add(key)
    return aliases(created, module)


def replicated_models(module: cst.Module) -> set[str]:
    """Names of the models passed to `ModelWithLoss(model, loss_fn)` and
    `LossInForward(compute, *modules)`."""
    found = {
        key
        for call in name_calls(module, WRAPPER_CLASS)
        if call.args and (key := name_key(call.args[0].value))
    }
    for call in name_calls(module, GENERAL_CLASS):
        found |= {key for arg in call.args[1:] if (key := name_key(arg.value))}
    return found
