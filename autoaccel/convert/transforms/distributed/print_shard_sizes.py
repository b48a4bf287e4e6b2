"""A printed `len(train_loader.dataset)` becomes `len(train_loader.sampler)`.

Each process reads its own shard, so progress lines (`[{batch_idx * len(data)}/{len(
train_loader.dataset)}]`) stopped at 1/WORLD_SIZE and averages over the dataset
(`train_loss / len(train_loader.dataset)`) came out WORLD_SIZE times too small. The
sampler's length is the shard's size under torchrun and the dataset's size in a single
process. Only what is printed changes: a step count computed from the dataset size may
need the whole set.
"""

from __future__ import annotations

import libcst as cst

from autoaccel.analysis.names import name_key
from autoaccel.analysis.program import Kind
from autoaccel.analysis.shapes import find, is_attribute, is_name
from autoaccel.convert.transforms.distributed._base import DistributedStep


class PrintShardSizes(DistributedStep):
    DESCRIPTION = "Print the size of this process's shard, not of the whole dataset."
    needs = (".dataset",)

    def visit_Module(self, node: cst.Module) -> None:
        self.sizes: set[cst.Attribute] = {
            length.args[0].value  # type: ignore[misc]
            for printed in find(node, cst.Call)
            if "builtins.print" in self.qualified_names(printed.func)
            for length in find(printed, cst.Call)
            if is_name(length.func, "len")
            and len(length.args) == 1
            and is_attribute(length.args[0].value, "dataset")
            and self._sharded(node, length.args[0].value.value)  # type: ignore[attr-defined]
        }

    def _sharded(self, module: cst.Module, loader: cst.BaseExpression) -> bool:
        """Whether every DataLoader `loader` (as read there) may hold is sharded."""
        calls = [obj.node for obj in self.script.values(loader) if obj.kind is Kind.LOADER]
        return bool(calls) and all(
            isinstance(call, cst.Call) and self.shards(module, call) for call in calls
        )

    def edited(self) -> list[cst.CSTNode]:
        return [*self.planned_statements(), *self.sizes]

    def leave_Attribute(self, original_node: cst.Attribute, updated_node: cst.Attribute) -> cst.Attribute:
        if original_node not in self.sizes:
            return updated_node
        loader = name_key(original_node.value)
        self.changed(original_node, f"prints the size of this process's shard: `len({loader}.sampler)`")
        return updated_node.with_changes(attr=cst.Name("sampler"))
