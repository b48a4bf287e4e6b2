"""A learning rate that drops on a plateau of a metric drops on every process alike.

`scheduler.step(val_loss)` of a `ReduceLROnPlateau` decides from a value each process
computes itself: a validation loss over its own share of the set, or over the whole set
with BatchNorm statistics that its own batches updated since DDP last broadcast them
(pytorch-speech-commands: 2.48594 on one process, 2.48559 on the other). One process may
then lower its learning rate while the other does not, and their parameters drift apart
with no error (DDP averages gradients, not updates). The metric goes through
`averaged_over_processes()`, which all-reduces it: every scheduler sees the same number.
Run with plain `python`, it is the value itself.
"""

from __future__ import annotations

import libcst as cst

from autoaccel.analysis.names import name_key
from autoaccel.analysis.rank_guards import rank_guarded
from autoaccel.analysis.shapes import find, is_method_call
from autoaccel.convert.transforms.distributed._base import (
    DIST_IMPORT,
    DistributedStep,
    number_over_processes,
)
from autoaccel.cst_edit import code_of

HELPER = "averaged_over_processes"
_HELPER_CODE = number_over_processes(
    HELPER, "`value`, a number each process computed itself, averaged over the processes.", True
)
_PLATEAU = frozenset(
    {
        "torch.optim.lr_scheduler.ReduceLROnPlateau",
        "torch.optim.lr_scheduler.lr_scheduler.ReduceLROnPlateau",
    }
)


class AgreeOnPlateau(DistributedStep):
    DESCRIPTION = "Average the metric a ReduceLROnPlateau steps on over the processes."
    needs = ("ReduceLROnPlateau",)

    def visit_Module(self, node: cst.Module) -> None:
        schedulers = {
            self._bound_key(call)
            for call in find(node, cst.Call)
            if self.qualified_names(call.func) & _PLATEAU
        } - {None}
        self.metrics: set[cst.Arg] = set()
        for call in find(node, cst.Call):
            if (
                is_method_call(call, "step")
                and name_key(call.func.value) in schedulers  # type: ignore[attr-defined]
                and call.args
                and not _averaged(call.args[0].value)
                and not rank_guarded(call, self.ancestors(call))
            ):
                self.metrics.add(call.args[0])
                self.changed(
                    call,
                    f"`{code_of(call.args[0].value)}` averaged over the processes before the"
                    " plateau scheduler steps on it: each computes its own, and one lowering"
                    " its learning rate alone would drift apart from the others",
                )
        if self.metrics:
            self.define_helper(node, HELPER, _HELPER_CODE)
            self.imports.append(DIST_IMPORT)
            self.needs_torch = True

    def _bound_key(self, call: cst.Call) -> str | None:
        """The name or `self.` attribute the scheduler `call` makes is assigned to."""
        parent = self.parent(call)
        if isinstance(parent, cst.Assign) and len(parent.targets) == 1:
            return name_key(parent.targets[0].target)
        return None

    def edited(self) -> list[cst.CSTNode]:
        return [*self.planned_statements(), *self.metrics]

    def leave_Arg(self, original_node: cst.Arg, updated_node: cst.Arg) -> cst.Arg:
        if original_node not in self.metrics:
            return updated_node
        return updated_node.with_changes(
            value=cst.Call(cst.Name(HELPER), [cst.Arg(updated_node.value)])
        )


def _averaged(value: cst.BaseExpression) -> bool:
    """A metric this step averaged already (a second pass changes nothing)."""
    return (
        isinstance(value, cst.Call)
        and isinstance(value.func, cst.Name)
        and (value.func.value == HELPER)
    )
