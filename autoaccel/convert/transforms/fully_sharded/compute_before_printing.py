"""Run the sharded model on every process before a print that only rank 0 will run.

`print(f"accuracy {evaluate(model, loader):.3f}")` goes under `if RANK == 0:` in the next
step, but `evaluate()` runs a forward pass that every process must take part in: the call
moves into a statement of its own just before the print (`evaluate_result =
evaluate(model, loader)`), which every process runs, and the print reads its result.
"""

from __future__ import annotations

import libcst as cst

from autoaccel.analysis.names import name_key
from autoaccel.analysis.rank_guards import rank_guarded
from autoaccel.analysis.shapes import find
from autoaccel.analysis.side_effects import PRINTS
from autoaccel.convert.transforms.distributed._base import (
    DistributedStep,
    fresh_name,
    parse_statements,
)
from autoaccel.convert.transforms.fully_sharded._sharded import (
    runs_sharded_model,
    script_functions,
    sharded_models,
)


class ComputeBeforePrinting(DistributedStep):
    DESCRIPTION = "Run sharded-model calls of a print on every process, before the print."
    code = "fsdp"

    def visit_Module(self, node: cst.Module) -> None:
        self.hoisted: dict[cst.Call, cst.Name] = {}
        sharded, functions = sharded_models(node, self.script), script_functions(node)
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
                if c is not call and runs_sharded_model(c, sharded, functions)
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

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        return self.hoisted.get(original_node, updated_node)


def _callee(call: cst.Call) -> str:
    func = call.func
    return func.attr.value if isinstance(func, cst.Attribute) else getattr(func, "value", "value")
