"""Refuse where only some processes would run a sharded model.

A sharded model's forward pass and a gathering of its state dict are collectives: every
process must run them, the same number of times, or the others wait forever. Code under a
rank test (`if RANK == 0:` of the script, or one the conversion put around a write) that
calls the model, passes it to a function of the script, to one that traces, exports or
profiles it (`torch.jit.trace(model, x)`), or gathers its state cannot be right; nor can a
TensorBoard writer's `add_graph(model, x)`, which traces a forward pass on rank 0 only
(the conversion makes every writer there, `log_on_rank_zero.py`).
"""

from __future__ import annotations

import libcst as cst

from autoaccel.analysis.names import name_key
from autoaccel.analysis.rank_guards import rank_guarded
from autoaccel.analysis.shapes import find, is_method_call
from autoaccel.convert.transforms.distributed._base import DistributedStep
from autoaccel.convert.transforms.distributed.compute_before_printing import (
    imported_modules,
    model_runners,
    runs_model,
    script_functions,
)
from autoaccel.convert.transforms.fully_sharded._helpers import COLLECTIVES
from autoaccel.convert.transforms.fully_sharded._sharded import sharded_models
from autoaccel.cst_edit import code_of

# Calls that run a forward pass of the model they are given, to trace, export or profile it.
TRACERS = frozenset(
    {
        "torch.jit.trace",
        "torch.onnx.export",
        "torch.export.export",
        "torchinfo.summary",
        "torchsummary.summary",
        "thop.profile",
    }
)
# The TensorBoard writer method that traces the model it is given.
ADD_GRAPH = "add_graph"


class EveryRankComputes(DistributedStep):
    DESCRIPTION = "Refuse sharded-model computations that only some processes run."
    code = "fsdp"

    def visit_Module(self, node: cst.Module) -> None:
        sharded, functions = sharded_models(node, self.script), script_functions(node)
        runners = model_runners(node, sharded, COLLECTIVES)
        modules = imported_modules(node)
        for call in find(node, cst.Call):
            model = next((arg.value for arg in call.args if name_key(arg.value) in sharded), None)
            # wherever it is called: the conversion makes every writer on rank 0 alone
            if model is not None and is_method_call(call, ADD_GRAPH):
                self._refuse_tracing(
                    call, model, "on rank 0 only (its TensorBoard writer logs there alone)"
                )
                return
            traces = model is not None and bool(self.qualified_names(call.func) & TRACERS)
            if not (traces or runs_model(call, sharded, functions, COLLECTIVES, runners, modules)):
                continue
            if not rank_guarded(call, self.ancestors(call)):
                continue
            if traces:
                self._refuse_tracing(call, model, "on some processes only (under a rank test)")
            else:
                self.skipped(
                    "fully_shard",
                    "this runs the sharded model (or gathers its state) on some processes only,"
                    " while every process must take part; compute it into a variable before the"
                    " rank test, by hand",
                    call,
                    wrong=True,
                )
            return

    def _refuse_tracing(self, call: cst.Call, model: cst.BaseExpression, where: str) -> None:
        """Refuse `call`, which runs a forward pass of the sharded `model` `where`."""
        self.skipped(
            "fully_shard",
            f"`{code_of(call.func)}({code_of(model)}, ...)` runs the sharded model {where},"
            " while its forward pass gathers the parameters from every process: drop"
            f" the call, or run it before the model is sharded (above `shard_model({code_of(model)})`"
            " in the result, which `--allow-partial` writes); `--to ddp` keeps it as it is",
            call,
            wrong=True,
        )
