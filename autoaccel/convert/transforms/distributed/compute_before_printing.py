"""Run the distributed model on every process before a print that only rank 0 will run.

`print(f"accuracy {evaluate(model, loader):.3f}")` goes under `if RANK == 0:` in the next
step, but `evaluate()` runs a forward pass that every process must take part in: a DDP
model with buffers (BatchNorm) broadcasts them at each forward, and a forward of a sharded
model gathers its parameters. On rank 0 alone the collective does not match the other
processes' (gloo: "Received data size doesn't match expected size", an abort). The call
moves into a statement of its own just before the print (`evaluate_result =
evaluate(model, loader)`), which every process runs, and the print reads its result. So
does a call that trains (`print(f"loss {train_one_epoch(model, ...):.4f}")`): under the
guard, only rank 0 would train.
"""

from __future__ import annotations

import libcst as cst

from autoaccel.analysis.names import name_key
from autoaccel.analysis.rank_guards import rank_guarded
from autoaccel.analysis.shapes import find, is_name
from autoaccel.analysis.side_effects import PRINTS
from autoaccel.convert.transforms.distributed.wrap_model import UNWRAPPED
from autoaccel.convert.transforms.distributed._base import (
    DistributedStep,
    fresh_name,
    local_names,
    parse_statements,
)

# Methods of a distributed model that run no forward pass and communicate nothing.
_LOCAL_METHODS = frozenset(
    {"train", "eval", "parameters", "named_parameters", "modules", "children", "zero_grad", "to"}
)


class ComputeBeforePrinting(DistributedStep):
    DESCRIPTION = "Run distributed-model calls of a print on every process, before the print."
    code = "ddp"
    # Functions the conversion defines that every process must call (none for DDP).
    collectives: tuple[str, ...] = ()

    def models(self, module: cst.Module) -> set[str]:
        """The names that hold a model whose calls communicate: the DDP wrappers."""
        return self.ddp_wrappers(module)

    def visit_Module(self, node: cst.Module) -> None:
        self.hoisted: dict[cst.Call, cst.Name] = {}
        models, functions = self.models(node), script_functions(node)
        runners = model_runners(node, models, self.collectives)
        modules = imported_modules(node)
        bound = {name_key(t.target) for t in find(node, cst.AssignTarget)}
        for call in find(node, cst.Call):
            if not self.qualified_names(call.func) & PRINTS or rank_guarded(
                call, self.ancestors(call)
            ):
                continue
            statement = self.statement_of(call)
            inner = [
                c
                for c in find(call, cst.Call)
                if c is not call
                and (
                    runs_model(c, models, functions, self.collectives, runners, modules)
                    or self.script.runs_training(c)  # `print(f"{train_epoch(...):.4f}")`
                )
            ]
            outermost = [
                c
                for c in inner
                if not any(c in find(other, cst.Call) for other in inner if other is not c)
            ]
            for value in outermost:
                name = fresh_name(f"{_callee(value)}_result", bound)
                bound.add(name)
                self.before.setdefault(statement, []).extend(
                    parse_statements(f"{name} = {cst.Module([]).code_for_node(value)}\n")
                )
                self.hoisted[value] = cst.Name(name)
                self.changed(value, f"`{name}` computed on every process before the rank-0 print")

    def edited(self) -> list[cst.CSTNode]:
        return [*self.planned_statements(), *self.hoisted]

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        return self.hoisted.get(original_node, updated_node)


def script_functions(module: cst.Module) -> set[str]:
    """Names of the functions and methods the module defines."""
    return {function.name.value for function in find(module, cst.FunctionDef)}


def runs_model(
    call: cst.Call,
    models: set[str],
    functions: set[str],
    collectives: tuple[str, ...] = (),
    runners: set[str] | frozenset[str] = frozenset(),
    modules: frozenset[str] = frozenset(),
) -> bool:
    """Whether `call` needs every process: a forward pass of one of `models` (`model(x)`,
    `model.generate(x)`), a function of the script given one (`evaluate(model, loader)`),
    one of the `runners` (see `model_runners`; not an attribute of one of the imported
    `modules`, `torch.save` beside the script's own `save()`), or one of the
    `collectives`."""
    func = call.func
    if name_key(func) in models or (collectives and is_name(func, *collectives)):
        return True
    if isinstance(func, cst.Attribute) and name_key(func.value) in models:
        return func.attr.value not in _LOCAL_METHODS
    if _root_name(func) in modules:
        return False  # `torch.save(...)`, not the script's `save()` that gathers a model
    callee = func.attr.value if isinstance(func, cst.Attribute) else getattr(func, "value", None)
    if callee == UNWRAPPED:
        return False  # the conversion's own helper: it hands out the bare model
    return callee in runners or (
        callee in functions and any(name_key(arg.value) in models for arg in call.args)
    )


def _root_name(func: cst.BaseExpression) -> str | None:
    """`torch` of `torch.save`, `np` of `np.random.seed`; None for a plain name."""
    root = func
    while isinstance(root, cst.Attribute):
        root = root.value
    return root.value if root is not func and isinstance(root, cst.Name) else None


def imported_modules(module: cst.Module) -> frozenset[str]:
    """The names `import x` / `import x.y as z` statements of `module` bind to modules."""
    names = set()
    for statement in find(module, cst.Import):
        for alias in cst.ensure_type(statement, cst.Import).names:
            bound = alias.evaluated_alias or alias.evaluated_name
            names.add(bound.split(".")[0])
    return frozenset(names)


def model_runners(
    module: cst.Module, models: set[str], collectives: tuple[str, ...] = ()
) -> set[str]:
    """Names of the script's functions that run one of `models` under a name they read
    from the module (hunkim's `translate()` runs the global `encoder` and `decoder`), or
    call such a function, directly or through others. A function that binds the name
    itself (a parameter, an assignment) runs its own model."""
    read = {function: models - local_names(function) for function in find(module, cst.FunctionDef)}
    modules = imported_modules(module)
    runners: set[str] = set()
    grew = True
    while grew:
        grew = False
        for function, models_read in read.items():
            if function.name.value in runners:
                continue
            if any(
                runs_model(call, models_read, set(), collectives, runners, modules)
                for call in find(function, cst.Call)
            ):
                runners.add(function.name.value)
                grew = True
    return runners


def _callee(call: cst.Call) -> str:
    func = call.func
    return func.attr.value if isinstance(func, cst.Attribute) else getattr(func, "value", "value")
