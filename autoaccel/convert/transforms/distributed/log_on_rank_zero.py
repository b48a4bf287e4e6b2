"""Experiment logs come from rank 0 only: TensorBoard writers, Weights & Biases runs the
script keeps, and logger classes of the project over a writer (yunjey's `Logger`).

`writer = SummaryWriter(log_dir)` on every process made one event file per process in the
same folder, and TensorBoard drew every process's curves (pytorch-vqvae logs its losses
from `train()`); `run = wandb.init(...)` made one run per process. The writer or run is
made on rank 0; the other ranks get a `NoWriter()`, which does nothing whatever it is
asked, so the calls that log (`writer.add_scalar(...)` in a function the writer is passed
to, `run.log(...)`, `with wandb.init() as run:` around the training) need no rank test of
their own. (A plain `wandb.init(...)` statement, like `wandb.log(...)`, goes under `if
RANK == 0:` with the prints: see `guard_rank_zero.py`.)
"""

from __future__ import annotations

import libcst as cst

from autoaccel.analysis.program import ClassInfo
from autoaccel.analysis.rank_guards import rank_guarded
from autoaccel.analysis.shapes import find, is_name
from autoaccel.convert.transforms.distributed._base import RANK, DistributedStep
from autoaccel.cst_edit import replacing

SUMMARY_WRITERS = frozenset(
    {
        "torch.utils.tensorboard.SummaryWriter",
        "torch.utils.tensorboard.writer.SummaryWriter",
        "tensorboardX.SummaryWriter",
        "tensorboardX.writer.SummaryWriter",
    }
)
WANDB_INIT = "wandb.init"
# What a logger class of the project may make in its `__init__` to write its logs.
_WRITER_FACTORIES = SUMMARY_WRITERS | {
    "tensorflow.summary.FileWriter",
    "tensorflow.summary.create_file_writer",
    "tensorflow.compat.v1.summary.FileWriter",
}
HELPER = "NoWriter"
_HELPER_CODE = f'''
class {HELPER}:
    """The log writer (SummaryWriter, wandb run, logger) of the ranks other than 0: it
    does nothing, whatever it is asked."""

    def __getattr__(self, name):
        return self

    def __call__(self, *args, **kwargs):
        return self

    def __getitem__(self, key):
        return self

    def __setitem__(self, key, value):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        return False
'''


class LogOnRankZero(DistributedStep):
    DESCRIPTION = "Make log writers (TensorBoard, kept wandb runs, loggers) on rank 0 only."

    def visit_Module(self, node: cst.Module) -> None:
        self.writers = {
            call
            for call in find(node, cst.Call)
            if self._makes_a_writer(call) and not rank_guarded(call, self.ancestors(call))
        }
        if self.writers:
            self.define_helper(node, HELPER, _HELPER_CODE)

    def _makes_a_writer(self, call: cst.Call) -> bool:
        """A SummaryWriter, a wandb run whose value the script keeps, or a logger of the
        project (see `_is_a_logger`)."""
        names, parent = self.qualified_names(call.func), self.parent(call)
        return (
            bool(names & SUMMARY_WRITERS)
            or (WANDB_INIT in names and not isinstance(parent, cst.Expr))
            or isinstance(parent, (cst.Assign, cst.AnnAssign))  # a logger kept in a name
            and any(
                obj.node is call and self._is_a_logger(obj.cls) for obj in self.script.values(call)
            )
        )

    @staticmethod
    def _is_a_logger(cls: ClassInfo | None) -> bool:
        """A class of the project whose `__init__` makes a log writer and none of whose
        methods returns a value (L1aoXingyu's and yunjey's `Logger`, over
        `tf.summary.FileWriter`): its instance may be a `NoWriter()` elsewhere."""
        init = cls.method("__init__") if cls is not None else None
        if init is None:
            return False
        index = init.module.index
        return any(
            index.qualified_names(call.func) & _WRITER_FACTORIES
            for call in find(init.node, cst.Call)
        ) and not any(
            node.value is not None and not is_name(node.value, "None")
            for node in find(cls.node, cst.Return)  # type: ignore[union-attr]
        )

    def edited(self) -> list[cst.CSTNode]:
        return [*self.planned_statements(), *self.writers]

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        if original_node not in self.writers:
            return updated_node
        self.changed(
            original_node,
            f"{self._writer_kind(original_node)} made on rank 0 only; the other ranks log"
            f" through `{HELPER}()`, which does nothing",
        )
        chosen = cst.parse_expression(f"WRITER if {RANK} == 0 else {HELPER}()")
        assert isinstance(chosen, cst.IfExp)
        return replacing(
            original_node, self.parent(original_node), chosen.with_changes(body=updated_node)
        )

    def _writer_kind(self, call: cst.Call) -> str:
        names = self.qualified_names(call.func)
        if WANDB_INIT in names:
            return "wandb run"
        if names & SUMMARY_WRITERS:
            return "TensorBoard writer"
        return f"`{cst.Module([]).code_for_node(call.func)}` logger"
