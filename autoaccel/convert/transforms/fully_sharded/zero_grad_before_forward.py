"""Call a sharded model's `zero_grad()` before its forward pass, not between its forward
and backward passes.

After a forward pass FSDP2 keeps the root module's parameters gathered, registered in place
of the shards until the backward pass reshards them: `model.zero_grad()` there clears the
gathered tensors' gradients, not those of the shards the optimizer steps, so every step's
gradients add to the last's (every process agreeing, nothing failing). Before the forward
pass the same call clears the shards' gradients; nothing in between reads a gradient.
"""

from __future__ import annotations

import libcst as cst

from autoaccel.analysis.names import name_key
from autoaccel.analysis.shapes import find, is_method_call
from autoaccel.convert.transforms.distributed._base import DistributedStep
from autoaccel.convert.transforms.fully_sharded._sharded import sharded_models
from autoaccel.cst_edit import code_of


class ZeroGradBeforeForward(DistributedStep):
    DESCRIPTION = "Move a sharded model's zero_grad() from after its forward pass to before it."
    code = "fsdp"

    def visit_Module(self, node: cst.Module) -> None:
        sharded = sharded_models(node, self.script)
        for loop in self.train_loops():
            for block in find(loop, cst.IndentedBlock):
                self._move_in(block, sharded)

    def _move_in(self, block: cst.IndentedBlock, sharded: set[str]) -> None:
        """Move a lone `model.zero_grad()` line of `block` that follows a line calling the
        sharded `model` (before any backward pass) to just above that line."""
        forward = None
        for statement in block.body:
            calls = find(statement, cst.Call)
            if any(is_method_call(call, "backward") for call in calls):
                return
            zeroed = next((call for call in calls if _zeroes(call, sharded)), None)
            if zeroed is not None and forward is not None and _alone(statement):
                self.replace[statement] = []
                self.before.setdefault(forward, []).append(statement)
                self.changed(
                    zeroed,
                    f"`{code_of(zeroed)}` moved before the forward pass: after it, FSDP clears"
                    " the gathered parameters' gradients, not the shards' the optimizer steps",
                )
                return
            if forward is None and any(_calls(call.func, sharded) for call in calls):
                forward = statement


def _calls(function: cst.BaseExpression, sharded: set[str]) -> bool:
    """Whether `function` names a sharded model (`model`, `self.net`)."""
    key = name_key(function)
    return key is not None and key in sharded


def _zeroes(call: cst.Call, sharded: set[str]) -> bool:
    """`model.zero_grad(...)` of a sharded `model`."""
    return (
        isinstance(call.func, cst.Attribute)
        and call.func.attr.value == "zero_grad"
        and _calls(call.func.value, sharded)
    )


def _alone(statement: cst.CSTNode) -> bool:
    """A line holding one expression statement (`model.zero_grad()`), nothing else."""
    return (
        isinstance(statement, cst.SimpleStatementLine)
        and len(statement.body) == 1
        and isinstance(statement.body[0], cst.Expr)
    )
