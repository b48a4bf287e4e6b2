"""`train_loader.sampler.set_epoch(epoch)` at the start of every epoch.

`DistributedSampler` shuffles with a seed made of its own seed and the epoch it was told;
without `set_epoch` every epoch reads the same order. The call goes at the top of the
epoch loop, which is found around the training step loop, or around a call of the
function that holds it (`for epoch ...: train(..., train_loader, ...)`).
"""

from __future__ import annotations

import libcst as cst

from autoaccel.analysis.names import name_key
from autoaccel.analysis.shapes import find, is_attribute, is_name, method_calls
from autoaccel.convert.transforms.distributed._base import (
    DISTRIBUTED,
    DistributedStep,
    parameters_of,
    parse_statements,
)
from autoaccel.cst_edit import code_of


class SetSamplerEpoch(DistributedStep):
    DESCRIPTION = "Call set_epoch(epoch) on the DistributedSampler at each epoch start."
    code = "ACC105"

    def visit_Module(self, node: cst.Module) -> None:
        sharded = {
            key
            for key, calls in self.script.loaders.items()
            if any(self.shards(node, call) for call in calls)
        }
        for loop in self.script.step_loops.values():
            if loop.node in self.train_loops() and loop.loader in sharded:
                self._set_epoch(node, loop.node, loop.loader)  # type: ignore[arg-type]

    def _set_epoch(self, module: cst.Module, loop: cst.CSTNode, loader: str) -> None:
        epochs = [a for a in self.ancestors(loop) if isinstance(a, cst.For)]
        function = self.scope_of(loop)
        if epochs and self.scope_of(epochs[0]) is function:
            self._insert(epochs[0], loader, loop)
            return
        for site in self._call_sites(module, function):
            outer = next((a for a in self.ancestors(site) if isinstance(a, cst.For)), None)
            expression = self._loader_at(site, function, loader)  # type: ignore[arg-type]
            if outer is not None and expression is not None:
                self._insert(outer, expression, loop)
                return
        self.skipped(
            "set_epoch",
            f"no epoch loop found around this training loop; call `{loader}.sampler.set_epoch(epoch)`"
            " at the start of every epoch by hand",
            loop,
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

    def _loader_at(self, site: cst.Call, function: cst.FunctionDef, loader: str) -> str | None:
        """How the caller spells the loader the function reads."""
        params = parameters_of(function)
        if loader not in params:
            return loader  # a global, or `self.loader` of the same object
        index = params.index(loader)
        keyword = next((a for a in site.args if a.keyword and a.keyword.value == loader), None)
        positional = [a for a in site.args if a.keyword is None and not a.star]
        arg = keyword or (positional[index] if index < len(positional) else None)
        return name_key(arg.value) if arg is not None else None

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
