"""Experiment logs come from rank 0 only: TensorBoard writers, and Weights & Biases runs
the script keeps.

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
WANDB_INIT = "wandb.init"
HELPER = "NoWriter"
_HELPER_CODE = f'''
class {HELPER}:
    """A SummaryWriter or wandb run for the ranks other than 0: it does nothing, whatever
    it is asked."""

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
    DESCRIPTION = "Make TensorBoard writers and kept wandb runs on rank 0 only."
    needs = ("SummaryWriter", WANDB_INIT)

    def visit_Module(self, node: cst.Module) -> None:
        self.writers = {
            call
            for call in find(node, cst.Call)
            if self._makes_a_writer(call) and not rank_guarded(call, self.ancestors(call))
        }
        if self.writers:
            self.define_helper(node, HELPER, _HELPER_CODE)

    def _makes_a_writer(self, call: cst.Call) -> bool:
        """A SummaryWriter, or a wandb run whose value the script keeps."""
        names = self.qualified_names(call.func)
        return bool(names & SUMMARY_WRITERS) or (
            WANDB_INIT in names and not isinstance(self.parent(call), cst.Expr)
        )

    def edited(self) -> list[cst.CSTNode]:
        return [*self.planned_statements(), *self.writers]

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        if original_node not in self.writers:
            return updated_node
        what = "wandb run" if WANDB_INIT in self.qualified_names(original_node.func) else "TensorBoard writer"
        self.changed(
            original_node,
            f"{what} made on rank 0 only; the other ranks log through `{HELPER}()`, which does"
            " nothing",
        )
        chosen = cst.parse_expression(f"WRITER if {RANK} == 0 else {HELPER}()")
        assert isinstance(chosen, cst.IfExp)
        return replacing(original_node, self.parent(original_node), chosen.with_changes(body=updated_node))
