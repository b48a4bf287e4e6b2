"""TensorBoard logs come from rank 0 only.

`writer = SummaryWriter(log_dir)` on every process made one event file per process in the
same folder, and TensorBoard drew every process's curves (pytorch-vqvae logs its losses
from `train()`). The writer is made on rank 0; the other ranks get a `NoWriter()`, whose
every method does nothing, so the calls that log (`writer.add_scalar(...)` in a function
the writer is passed to, `with SummaryWriter() as w:`) need no rank test of their own.
"""

from __future__ import annotations

import libcst as cst

from autoaccel.analysis.rank_guards import rank_guarded
from autoaccel.analysis.shapes import find
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
HELPER = "NoWriter"
_HELPER_CODE = f'''
class {HELPER}:
    """A SummaryWriter for the ranks other than 0: every method does nothing."""

    def __getattr__(self, name):
        return lambda *args, **kwargs: None

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        return False
'''


class LogOnRankZero(DistributedStep):
    DESCRIPTION = "Make TensorBoard writers on rank 0 only."
    needs = ("SummaryWriter",)

    def visit_Module(self, node: cst.Module) -> None:
        self.writers = {
            call
            for call in find(node, cst.Call)
            if self.qualified_names(call.func) & SUMMARY_WRITERS and not self._on_rank_zero_only(call)
        }
        if self.writers:
            self.define_helper(node, HELPER, _HELPER_CODE)

    def _on_rank_zero_only(self, call: cst.Call) -> bool:
        """Under a rank test already, or `SummaryWriter(...) if RANK == 0 else ...`."""
        parent = self.parent(call)
        return rank_guarded(call, self.ancestors(call)) or (
            isinstance(parent, cst.IfExp) and parent.body is call
        )

    def edited(self) -> list[cst.CSTNode]:
        return [*self.planned_statements(), *self.writers]

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        if original_node not in self.writers:
            return updated_node
        self.changed(
            original_node,
            f"TensorBoard writer made on rank 0 only; the other ranks log through `{HELPER}()`,"
            " which does nothing",
        )
        chosen = cst.parse_expression(f"WRITER if {RANK} == 0 else {HELPER}()")
        assert isinstance(chosen, cst.IfExp)
        return replacing(original_node, self.parent(original_node), chosen.with_changes(body=updated_node))
