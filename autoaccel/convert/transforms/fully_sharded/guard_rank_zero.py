"""Rank-0 IO as under `--to ddp`, except that a function that writes keeps running on
every rank when it gathers the model's shards (`full_state_dict()` before a checkpoint
save) or runs the sharded model (PyTorch-GAN's `sample_image()`: the generator's forward
pass needs every process); only its writes go under `if RANK == 0:`. A sharded model
given to a function of a module the conversion leaves as it is that saves a checkpoint
among other work (an early stopping's `__call__`) is refused where it is given: each
process would save its own shards (DTensors), which a later load cannot spread."""

from __future__ import annotations

import libcst as cst

from autoaccel.analysis.names import name_key
from autoaccel.analysis.program import FunctionInfo
from autoaccel.analysis.shapes import find
from autoaccel.convert.transforms.distributed import GuardRankZero
from autoaccel.convert.transforms.distributed._base import runs_save, sole_callee, where
from autoaccel.convert.transforms.distributed.compute_before_printing import (
    imported_modules,
    model_runners,
    runs_model,
    script_functions,
)
from autoaccel.convert.transforms.fully_sharded._helpers import COLLECTIVES
from autoaccel.convert.transforms.fully_sharded._sharded import sharded_models


class GuardRankZeroGathering(GuardRankZero):
    collectives = COLLECTIVES

    def visit_Module(self, node: cst.Module) -> None:
        super().visit_Module(node)
        sharded = sharded_models(node, self.script)
        for call in find(node, cst.Call):
            helper = sole_callee(self.script.program, call)
            given = next(
                (name_key(a.value) for a in call.args if name_key(a.value) in sharded), None
            )
            if (
                given is None
                or helper is None
                or helper.module in self._converted_modules
                or call in self.helpers  # refused or guarded by `GuardRankZero`
                or not runs_save(self.script.program, call)
            ):
                continue
            owner = f"{helper.cls.node.name.value}." if helper.cls is not None else ""
            self.skipped(
                "full state dict",
                f"`{owner}{helper.name}()` ({where(helper.module, helper.node)}) saves a checkpoint"
                f" given the sharded `{given}`: each process would save its own part of it;"
                f" gather it with `full_state_dict({given})` on every process and save that on"
                " rank 0 by hand",
                call,
                wrong=True,
            )

    def runs_on_every_rank(self, module: cst.Module, function: cst.FunctionDef) -> bool:
        """Also where it runs the sharded model, or takes its state dict (a Solver's
        `save(self)`: `torch.save(self.model.state_dict(), path)`), which every process
        gathers (`GatherStateDicts`)."""
        sharded, functions = sharded_models(module, self.script), script_functions(module)
        runners, modules = model_runners(module, sharded), imported_modules(module)
        return super().runs_on_every_rank(module, function) or any(
            runs_model(call, sharded, functions, (), runners, modules)
            or isinstance(call.func, cst.Attribute)
            and call.func.attr.value == "state_dict"
            and name_key(call.func.value) in sharded
            for call in find(function, cst.Call)
            if isinstance(call, cst.Call)
        )

    def helper_on_every_rank(
        self, module: cst.Module, call: cst.Call, helper: FunctionInfo
    ) -> str | None:
        """Also when it is given a sharded model: every process holds a shard of it."""
        sharded = sharded_models(module, self.script)
        given = next((name_key(a.value) for a in call.args if name_key(a.value) in sharded), None)
        if given is None:
            return super().helper_on_every_rank(module, call, helper)
        return (
            f"it is given the sharded `{given}`, of which each process holds a part (every"
            f" process gathers the whole state dict with `full_state_dict({given})`)"
        )
