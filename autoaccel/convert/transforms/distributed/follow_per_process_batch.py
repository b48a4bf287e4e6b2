"""Tensor shapes built from the batch-size variable follow the per-process batch.

The training DataLoader of each process loads `per_process_batch_size(batch_size)`
samples, but a step written for one process may still shape tensors by the global
batch size: yunjey's GAN reshaped its images with `images.reshape(batch_size, -1)` and
built its labels and noise with `torch.ones(batch_size, 1)` / `torch.randn(batch_size,
z)`, a shape error on every process. In the training step, such shape arguments become
the per-process batch; a print or log keeps the variable, unless it divides a sum the
training loop adds up (`running_loss / (batch_size * i)`: under DDP a sum over this
process's batches, so ~1/WORLD_SIZE of the original average); any other use in the step
(where the tool cannot tell which batch it means) is refused with its line. Buffers made
before the loop and read by the step follow too: CycleGAN copied each batch into
`input_A = Tensor(opt.batchSize, ...)` (`Tensor` a legacy tensor type) and compared with
labels `Tensor(opt.batchSize).fill_(1.0)`, a shape error, or for one sample a process a
broadcast copy that trains it `batchSize` times.
"""

from __future__ import annotations

import libcst as cst

from autoaccel.analysis.batch_pairs import assigned
from autoaccel.analysis.batch_pairs import read as names_read
from autoaccel.analysis.names import name_key
from autoaccel.analysis.phases import phases_of
from autoaccel.analysis.program import TENSOR_TYPES, Kind
from autoaccel.analysis.script_model import Missing, Unknown
from autoaccel.analysis.shapes import find, is_method_call, is_name
from autoaccel.convert.transforms.distributed._base import WORLD_SIZE, DistributedStep, builds
from autoaccel.convert.transforms.distributed.shard_train_loader import BATCH_HELPER

# Calls whose positional arguments are a shape: torch's tensor factories, the tensor
# types (`torch.FloatTensor(4, 3)`), and the tensor methods that take sizes.
SHAPE_FACTORIES = frozenset(
    f"torch.{name}" for name in ("ones", "zeros", "empty", "full", "rand", "randn", "randint")
) | frozenset({"torch.Tensor", *TENSOR_TYPES})
SHAPE_METHODS = ("reshape", "view", "expand", "new_ones", "new_zeros", "new_empty", "new_full")
# Calls that only show a value: a batch-size there is left as the script wrote it.
SHOWING = frozenset({"builtins.print", "logging.info", "logging.debug", "logging.warning"})


class FollowPerProcessBatch(DistributedStep):
    DESCRIPTION = "Shape the step's tensors by the per-process batch, not the global one."
    needs = (BATCH_HELPER,)

    def visit_Module(self, node: cst.Module) -> None:
        self.per_process: set[cst.CSTNode] = set()
        if self.options.per_process_batch:
            return
        sizes = self._batch_size_variables()
        if not sizes:
            return
        in_training = {
            read for code in self.train_code() for read in find(code, (cst.Name, cst.Attribute))
        } - self._in_evaluation_phases()
        trained = {key for read in in_training if (key := name_key(read)) is not None}
        for read in find(node, (cst.Name, cst.Attribute)):
            if size_key(read) not in sizes or self._is_part_of_name(read):
                continue
            if self._shown(read):
                self._follow_printed(read)
            elif read in in_training:
                self._follow(read)
            elif self._shapes_a_buffer_of_the_step(read, trained):
                self._shape(read, "a tensor the training step reads")

    def _in_evaluation_phases(self) -> set[cst.CSTNode]:
        """The reads of the training loops over `loaders[phase]` that run only in phases
        that do not train (`if phase == "val": ... i * args.batch_size`): their loader
        keeps the global batch."""
        index = self.script.index
        found: set[cst.CSTNode] = set()
        for step in self.script.step_loops.values():
            phases = phases_of(step, index) if index is not None else None
            if phases is not None:
                found |= {
                    read
                    for read in find(step.node.body, (cst.Name, cst.Attribute))
                    if phases.in_evaluation(read, index)  # type: ignore[arg-type]
                }
        return found

    def _batch_size_variables(self) -> set[str]:
        """The variables (`batch_size`, `args.batch_size`) the sharded training loaders
        take their batch size from."""
        found: set[str] = set()
        for step in self.script.step_loops.values():
            if step.node not in self.train_loops():
                continue
            for loader in step.loaders:
                if not isinstance(loader.node, cst.Call):
                    continue
                value = self.script.keyword(loader.node, "batch_size")
                if isinstance(value, (Missing, Unknown)):
                    continue
                if isinstance(value, cst.Call) and is_name(value.func, BATCH_HELPER) and value.args:
                    value = value.args[0].value
                key = size_key(value)
                if key is not None and not isinstance(value, cst.Subscript):
                    found.add(key)
        return found

    def _is_part_of_name(self, read: cst.CSTNode) -> bool:
        """`batch_size` as the `.batch_size` of `args.batch_size`, or inside the per-process
        helper's call."""
        parent = self.parent(read)
        if isinstance(parent, cst.Attribute) and (
            parent.attr is read or name_key(parent) is not None
        ):
            return True
        return any(
            isinstance(a, cst.Call) and is_name(a.func, BATCH_HELPER) for a in self.ancestors(read)
        )

    def _shown(self, read: cst.BaseExpression) -> bool:
        """Whether `read` is part of what a print or log shows."""
        return any(
            isinstance(a, cst.FormattedString)
            or isinstance(a, cst.Call)
            and self.qualified_names(a.func) & SHOWING
            for a in self.ancestors(read)
        )

    def _follow_printed(self, read: cst.BaseExpression) -> None:
        """A shown batch size stays, unless it counts the samples of an average of a
        training sum (anywhere in the module: the epoch's summary follows its loop) or of
        a count the step makes of its batch."""
        if self.divides_training_sum(read) or self._divides_a_count_of_the_batch(read):
            self.per_process.add(read)
            self.changed(
                read,
                f"`{size_key(read)}` counts the samples of a printed average of this"
                f" process's batches: `{BATCH_HELPER}({size_key(read)})`",
            )

    def _divides_a_count_of_the_batch(self, read: cst.BaseExpression) -> bool:
        """`correct.item() / float(args.batch_size)` printed in a training step loop, where
        `correct` is computed in that loop from its batch: a count over this process's
        batch, which the global batch size would halve on two processes."""
        child: cst.CSTNode = read
        for ancestor in self.ancestors(read):
            if isinstance(ancestor, cst.BinaryOperation) and isinstance(
                ancestor.operator, cst.Divide
            ):
                break
            child = ancestor
        else:
            return False
        if ancestor.right is not child:
            return False
        for loop in self.train_loops():
            if not any(a is loop for a in self.ancestors(read)):
                continue
            derived = set(self.script.step_loops[loop].batch_names)
            for statement in find(loop.body, cst.SimpleStatementLine):
                if any(a is statement for a in self.ancestors(read)):
                    break
                if names_read(statement) & derived:
                    derived |= assigned(statement)
            return bool(names_read(ancestor.left) & derived)
        return False

    def _shapes_a_buffer_of_the_step(self, read: cst.BaseExpression, trained: set[str]) -> bool:
        """`read` shapes a tensor made outside the step and bound to a name the step reads
        (`input_A = Tensor(opt.batchSize, 3, H, W)`)."""
        if not self._is_shape_argument(read, list(self.ancestors(read))):
            return False
        statement = self.statement_of(read)
        return any(builds(statement, key) for key in trained)

    def _shape(self, read: cst.BaseExpression, tensor: str) -> None:
        self.per_process.add(read)
        self.changed(
            read,
            f"`{size_key(read)}` shapes {tensor}: it takes the per-process batch,"
            f" `{BATCH_HELPER}({size_key(read)})`",
        )

    def _follow(self, read: cst.BaseExpression) -> None:
        if self._is_shape_argument(read, list(self.ancestors(read))):
            self._shape(read, "a tensor of the training step")
            return
        self.skipped(
            "per-process batch",
            f"the training step uses the global batch size `{size_key(read)}`, while each"
            f" process loads `{size_key(read)} // {WORLD_SIZE}` samples; use the batch's own"
            " size (`len(x)`) or the per-process one by hand, or convert with"
            f" `--per-process-batch` (each process then loads `{size_key(read)}` samples, a"
            f" global batch `{WORLD_SIZE}` times larger)",
            read,
            wrong=True,
        )

    def _is_shape_argument(self, read: cst.CSTNode, ancestors: list[cst.CSTNode]) -> bool:
        """`read` is a positional argument (or an element of a tuple one) of a call that
        takes a shape."""
        arg = ancestors[0] if ancestors else None
        if isinstance(arg, cst.Element):
            arg = (
                ancestors[2] if isinstance(ancestors[1], cst.Tuple) and len(ancestors) > 2 else None
            )
        if not isinstance(arg, cst.Arg) or arg.keyword is not None:
            return False
        call = self.parent(arg)
        return isinstance(call, cst.Call) and (
            bool(self.qualified_names(call.func) & SHAPE_FACTORIES)
            or is_method_call(call, *SHAPE_METHODS)
            or any(value.kind is Kind.TENSOR_TYPE for value in self.script.values(call.func))
        )

    def edited(self) -> list[cst.CSTNode]:
        return [*self.planned_statements(), *self.per_process]

    def leave_Name(self, original_node: cst.Name, updated_node: cst.Name) -> cst.BaseExpression:
        return self._per_process(original_node, updated_node)

    def leave_Attribute(
        self, original_node: cst.Attribute, updated_node: cst.Attribute
    ) -> cst.BaseExpression:
        return self._per_process(original_node, updated_node)

    def _per_process(
        self, original: cst.CSTNode, updated: cst.BaseExpression
    ) -> cst.BaseExpression:
        if original not in self.per_process:
            return updated
        return cst.Call(cst.Name(BATCH_HELPER), [cst.Arg(updated)])


def size_key(node: cst.BaseExpression) -> str | None:
    """`name_key`, or the dotted name of an option: `args.batch_size`, `opt.batchSize`."""
    key = name_key(node)
    if key is None and isinstance(node, cst.Attribute):
        base = size_key(node.value)
        return None if base is None else f"{base}.{node.attr.value}"
    return key
