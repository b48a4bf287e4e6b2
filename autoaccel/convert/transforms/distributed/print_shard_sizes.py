"""A printed `len(train_loader.dataset)` becomes `len(train_loader.sampler)`.

Each process reads its own shard, so progress lines (`[{batch_idx * len(data)}/{len(
train_loader.dataset)}]`) stopped at 1/WORLD_SIZE and averages over the dataset
(`train_loss / len(train_loader.dataset)`) came out WORLD_SIZE times too small. The
sampler's length is the shard's size under torchrun and the dataset's size in a single
process. An average of a training sum over the dataset itself (`running_loss /
len(train_set)`) divides by the sampler of the sharded loader that reads it, when a name
there holds that loader. Such an average is changed wherever it is (a Trainer method's
`return total_loss / len(trainloader.dataset)`, the loader a parameter or `self.`
attribute); any other size only where it is printed: a step count computed from the
dataset size may need the whole set.
"""

from __future__ import annotations

import libcst as cst

from autoaccel.analysis.names import name_key
from autoaccel.analysis.program import Kind, Values, argument
from autoaccel.analysis.shapes import find, is_attribute, is_name
from autoaccel.convert.transforms.distributed._base import DistributedStep, local_names


class PrintShardSizes(DistributedStep):
    DESCRIPTION = "Print the size of this process's shard, not of the whole dataset."
    needs = (".dataset", "len(")

    def visit_Module(self, node: cst.Module) -> None:
        self.sizes: dict[cst.Attribute, bool] = {}  # `x.dataset` -> whether it is printed
        self.dataset_sizes: dict[cst.Call, str] = {}  # `len(train_set)`: the loader's name
        printed = {
            length
            for call in find(node, cst.Call)
            if "builtins.print" in self.qualified_names(call.func)
            for length in find(call, cst.Call)
        }
        for length in find(node, cst.Call):
            if not is_name(length.func, "len") or len(length.args) != 1:
                continue
            averages = self.divides_training_sum(length)
            if length not in printed and not averages:
                continue
            measured = length.args[0].value
            if is_attribute(measured, "dataset"):
                if self._sharded(measured.value):  # type: ignore[attr-defined]
                    self.sizes[measured] = length in printed  # type: ignore[index]
            elif averages:
                loader = self._sharded_loader_of(node, measured, length)
                if loader is not None:
                    self.dataset_sizes[length] = loader

    def _sharded(self, loader: cst.BaseExpression) -> bool:
        """Whether every DataLoader `loader` (as read there) may hold is sharded, where
        it is built (in a module of the project: `prepare_data()` of a utils module)."""
        loaders = [obj for obj in self.script.values(loader) if obj.kind is Kind.LOADER]
        return bool(loaders) and all(
            isinstance(obj.node, cst.Call) and self.shards_loader(obj) for obj in loaders
        )

    def _sharded_loader_of(
        self, module: cst.Module, dataset: cst.BaseExpression, at: cst.CSTNode
    ) -> str | None:
        """A name that `at` can read and that holds only sharded DataLoaders of every
        dataset `dataset` may be."""
        datasets = self.script.values(dataset)
        if not datasets:
            return None
        loaders: Values = frozenset(
            obj
            for call in find(module, cst.Call)
            if self._reads_all(call, datasets) and self.shards(module, call)
            for obj in self.script.values(call)
            if obj.kind is Kind.LOADER and obj.node is call
        )
        if not loaders:
            return None
        scope = self.scope_of(at)
        local = local_names(scope) if scope is not None else set()
        for code, key in self.script.holders(loaders):
            readable = (
                code is scope
                or code is module
                and key not in local
                or isinstance(code, cst.ClassDef)
                and code in self.ancestors(at)
            )
            if readable and self.script.held_by(key) <= loaders:
                return key
        return None

    def _reads_all(self, call: cst.Call, datasets: Values) -> bool:
        """Whether `call` (a DataLoader) reads a dataset that may be any of `datasets`."""
        read = argument(call, 0, "dataset")
        return read is not None and datasets <= self.script.values(read)

    def edited(self) -> list[cst.CSTNode]:
        return [*self.planned_statements(), *self.sizes, *self.dataset_sizes]

    def leave_Attribute(
        self, original_node: cst.Attribute, updated_node: cst.Attribute
    ) -> cst.Attribute:
        if original_node not in self.sizes:
            return updated_node
        loader = name_key(original_node.value)
        if self.sizes[original_node]:
            self.changed(
                original_node, f"prints the size of this process's shard: `len({loader}.sampler)`"
            )
        else:
            self.changed(
                original_node,
                f"divides a sum over this process's shard by its size: `len({loader}.sampler)`",
            )
        return updated_node.with_changes(attr=cst.Name("sampler"))

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.Call:
        loader = self.dataset_sizes.get(original_node)
        if loader is None:
            return updated_node
        self.changed(
            original_node,
            f"divides a sum over this process's shard by its size: `len({loader}.sampler)`",
        )
        sampler = cst.parse_expression(f"{loader}.sampler")
        return updated_node.with_changes(args=[updated_node.args[0].with_changes(value=sampler)])
