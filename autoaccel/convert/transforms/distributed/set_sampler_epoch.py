"""`train_loader.sampler.set_epoch(epoch)` at the start of every epoch.

`DistributedSampler` shuffles with a seed made of its own seed and the epoch it was told;
without `set_epoch` every epoch reads the same order. The call goes at the top of the
epoch loop, which is found around the training step loop, or around a call of the
function that holds it (`for epoch ...: train(..., train_loader, ...)`).
"""

from __future__ import annotations

import libcst as cst

from autoaccel.analysis.names import name_key
from autoaccel.analysis.script_model import StepLoop
from autoaccel.analysis.shapes import bound_names, find, is_attribute, is_name, method_calls
from autoaccel.convert.transforms.distributed._base import (
    DISTRIBUTED,
    DistributedStep,
    parse_statements,
)


class SetSamplerEpoch(DistributedStep):
    DESCRIPTION = "Call set_epoch(epoch) on the DistributedSampler at each epoch start."
    code = "ACC105"

    def visit_Module(self, node: cst.Module) -> None:
        for loop in self.script.step_loops.values():
            if loop.node in self.train_loops() and any(self.shards_loader(loader) for loader in loop.loaders):
                self._set_epoch(node, loop)

    def _set_epoch(self, module: cst.Module, loop: StepLoop) -> None:
        epochs = [a for a in self.ancestors(loop.node) if isinstance(a, cst.For)]
        function = self.scope_of(loop.node)
        if function is not None and method_calls(function.body, "set_epoch"):
            return  # the function that trains an epoch sets it (`train_sampler.set_epoch(epoch)`)
        if epochs and self.scope_of(epochs[0]) is function:
            outers = [epochs[0]]
        else:
            outers = [
                outer
                for site in self._call_sites(module, function)
                if (outer := next((a for a in self.ancestors(site) if isinstance(a, cst.For)), None))
            ]
        for outer in outers:
            loader = self._holder(outer, loop)
            if loader is not None:
                self._insert(outer, loader, loop.node)
                return
        self.skipped(
            "set_epoch",
            f"no epoch loop found around this training loop; call `{loop.loader}.sampler.set_epoch(epoch)`"
            " at the start of every epoch by hand",
            loop.node,
        )

    def _call_sites(self, module: cst.Module, function: cst.FunctionDef | None) -> list[cst.Call]:
        if function is None:
            return []
        name = function.name.value
        return [
            c
            for c in find(module, cst.Call)
            if is_name(c.func, name) or (is_attribute(c.func, name) and is_name(c.func.value, "self"))
        ]

    def _holder(self, epoch_loop: cst.For, step: StepLoop) -> str | None:
        """A name that holds the training loader when `epoch_loop` starts: a parameter
        or earlier assignment of its function, an attribute of `self`, or a global (an
        alias made inside the epoch loop does not exist yet at its top)."""
        program, loaders = self.script.program, step.loaders
        assert program is not None and self.script.module is not None
        function = self.scope_of(epoch_loop)
        info = program.functions.get(function) if function is not None else None
        candidates: list[tuple[object, str, str]] = []  # (owner, name, spelling)
        if info is not None:
            start = self.line_of(epoch_loop)
            local = [p.name.value for p in info.node.params.params] + [
                name
                for target in find(info.node.body, cst.AssignTarget)
                if self.line_of(target) < start
                for name in bound_names(target.target)
            ]
            candidates += [(info.scope.owner(name), name, name) for name in local]
            if info.cls is not None:
                candidates += [
                    (info.cls.family, attr, f"self.{attr}")
                    for (owner, attr) in program.values
                    if owner is info.cls.family and isinstance(attr, str)
                ]
        scope = self.script.module.scope
        candidates += [(scope, name, name) for name in scope.bindings]
        holders = [
            spelling for owner, name, spelling in candidates
            if program.read((owner, name)) & loaders  # type: ignore[arg-type]
        ]
        if step.loader in holders:
            return step.loader
        return holders[0] if holders else None

    def _insert(self, epoch_loop: cst.For, loader: str, loop: cst.CSTNode) -> None:
        epoch = name_key(epoch_loop.target)
        body = epoch_loop.body
        if epoch is None or not isinstance(body, cst.IndentedBlock):
            self.skipped("set_epoch", f"call `{loader}.sampler.set_epoch(epoch)` at the start of every epoch by hand", epoch_loop)
            return
        if method_calls(body, "set_epoch"):
            return
        first = body.body[0]
        self.before.setdefault(first, []).extend(
            parse_statements(f"if {DISTRIBUTED}:\n    {loader}.sampler.set_epoch({epoch})\n")
        )
        self.changed(first, f"`{loader}.sampler.set_epoch({epoch})`: a new shuffle every epoch")
