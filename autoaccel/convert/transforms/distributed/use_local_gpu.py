"""`"cuda:0"` becomes `"cuda"`: after `torch.cuda.set_device(LOCAL_RANK)` that is each
process's own GPU (and still GPU 0 for a single process). The keys of a `map_location`
dict are left alone: they name where a checkpoint was saved, not a device to use."""

from __future__ import annotations

import libcst as cst

from autoaccel.analysis.shapes import is_name
from autoaccel.convert.transforms.distributed._base import DistributedStep


class UseLocalGpu(DistributedStep):
    DESCRIPTION = "Use each process's own GPU instead of a fixed `cuda:N`."
    needs = ("cuda:",)

    def leave_SimpleString(
        self, original_node: cst.SimpleString, updated_node: cst.SimpleString
    ) -> cst.SimpleString:
        value = original_node.evaluated_value
        if not isinstance(value, str) or not value.startswith("cuda:"):
            return updated_node
        if self._saved_location(original_node):
            return updated_node
        if value != "cuda:0":
            self.skipped(
                "local GPU",
                f"`{value}` names a fixed GPU; use `cuda:{{LOCAL_RANK}}` to give each process its own",
                original_node,
            )
            return updated_node
        self.changed(original_node, '`"cuda:0"` -> `"cuda"`: the GPU of this process\'s local rank')
        quote = original_node.quote
        return updated_node.with_changes(value=f"{original_node.prefix}{quote}cuda{quote}")

    def _saved_location(self, node: cst.SimpleString) -> bool:
        """`"cuda:0"` in `map_location={"cuda:0": ...}`."""
        element = self.parent(node)
        if not isinstance(element, cst.DictElement) or element.key is not node:
            return False
        argument = self.parent(self.parent(element))  # type: ignore[arg-type]
        return isinstance(argument, cst.Arg) and is_name(argument.keyword, "map_location")
