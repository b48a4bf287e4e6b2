"""An evaluation that reads the training loader evaluates the whole training set.

The training loader reads each process's shard through its `DistributedSampler`, so an
evaluation over it after training (a ViT solver's `test(train=True)`: train accuracy, loss
and confusion matrix) covered 1/WORLD_SIZE of the set, and rank 0 printed its shard's
numbers as the set's (a confusion matrix of 16 samples where the original counts 32;
thirteenth unseen set). Its loop reads `whole(loader)` instead: a loader of the same
dataset without the sampler, the global batch a step, on every process; any other loader
(the test set) passes through as it is.
"""

from __future__ import annotations

import libcst as cst

from autoaccel.analysis.shapes import find, is_name
from autoaccel.analysis.training import LoopRole
from autoaccel.convert.transforms.distributed._base import WORLD_SIZE, DistributedStep
from autoaccel.cst_edit import code_of

WHOLE = "whole"
# How a loop may spell the loader it reads: `loader`, `self.train_loader`, `loaders["train"]`.
_SPELLINGS = (cst.Name, cst.Attribute, cst.Subscript)
_WHOLE_CODE = f'''
def {WHOLE}(loader):
    """All of a training loader's data, where its sampler gives this process a shard: an
    evaluation over it sees the whole set on every process. Another loader, as it is."""
    if not isinstance(loader.sampler, torch.utils.data.DistributedSampler):
        return loader
    return torch.utils.data.DataLoader(
        loader.dataset,
        batch_size=loader.batch_size * {WORLD_SIZE},
        num_workers=loader.num_workers,
        collate_fn=loader.collate_fn,
        pin_memory=loader.pin_memory,
        drop_last=loader.drop_last,
    )
'''


class EvaluateWhole(DistributedStep):
    DESCRIPTION = "Evaluate the whole training set where an evaluation reads the training loader."

    def visit_Module(self, node: cst.Module) -> None:
        self.wholes: set[cst.CSTNode] = set()
        steps = self.script.training.step_loops.values()
        # the loaders training reads (a test loader the script shards itself, as Horovod's
        # examples do before averaging the metrics, is left as it is)
        training = {loader for s in steps if s.role is LoopRole.TRAIN for loader in s.loaders}
        for step in steps:
            loop = step.node
            if (
                step.role is not LoopRole.EVAL
                or step.module is None
                or step.module.tree is not node
                or not isinstance(loop, cst.For)
                or not any(
                    loader in training
                    and isinstance(loader.node, cst.Call)
                    and self.shards_loader(loader)
                    for loader in step.loaders
                )
            ):
                continue
            read = next((n for n in find(loop.iter, _SPELLINGS) if code_of(n) == step.loader), None)
            if read is None or self._read_whole(read):
                continue
            self.wholes.add(read)
            self.changed(
                loop,
                f"the evaluation reads `{WHOLE}({step.loader})`: the training loader's whole"
                " set, not this process's shard",
            )
        if self.wholes:
            self.define_helper(node, WHOLE, _WHOLE_CODE)
            self.imports.append("import torch")

    def _read_whole(self, read: cst.CSTNode) -> bool:
        """Whether `read` is the argument of a `whole(...)` call (converted before)."""
        arg = self.parent(read)
        call = self.parent(arg) if arg is not None else None
        return isinstance(call, cst.Call) and is_name(call.func, WHOLE)

    def edited(self) -> list[cst.CSTNode]:
        return [*self.planned_statements(), *self.wholes]

    def _whole(self, original: cst.CSTNode, updated: cst.BaseExpression) -> cst.BaseExpression:
        return cst.Call(cst.Name(WHOLE), [cst.Arg(updated)]) if original in self.wholes else updated

    def leave_Name(self, original_node: cst.Name, updated_node: cst.Name) -> cst.BaseExpression:
        return self._whole(original_node, updated_node)

    def leave_Attribute(
        self, original_node: cst.Attribute, updated_node: cst.Attribute
    ) -> cst.BaseExpression:
        return self._whole(original_node, updated_node)

    def leave_Subscript(
        self, original_node: cst.Subscript, updated_node: cst.Subscript
    ) -> cst.BaseExpression:
        return self._whole(original_node, updated_node)
