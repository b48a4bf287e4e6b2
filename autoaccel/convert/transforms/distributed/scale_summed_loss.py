"""A training loss summed over the batch is multiplied by WORLD_SIZE before `backward()`.

DDP averages gradients over processes, and each process sums over its share of the
global batch, so every update would be 1/WORLD_SIZE of the original's (pytorch/examples'
VAE sums). `(loss * WORLD_SIZE).backward()` gives back the gradient of the sum over the
whole batch: exactly the original's. A loss that mixes a sum with other terms (a mean,
a regulariser) cannot be scaled as a whole: refused with its line. With
`--per-process-batch` each process sums a whole batch of its own and the average keeps
the original's scale, so nothing changes.
"""

from __future__ import annotations

import libcst as cst

from autoaccel.analysis.loss_reduction import LossReductions, Reduction
from autoaccel.analysis.shapes import is_binary, is_method_call, is_name, method_calls
from autoaccel.convert.transforms.distributed._base import WORLD_SIZE, DistributedStep

COMMENT = "# a sum: DDP averages over processes"


class ScaleSummedLoss(DistributedStep):
    DESCRIPTION = "Multiply training losses summed over the batch by WORLD_SIZE."
    needs = ("sum", "size_average")

    def visit_Module(self, node: cst.Module) -> None:
        self.scaled: set[cst.BaseExpression] = set()  # losses to multiply by WORLD_SIZE
        self.statements: set[cst.CSTNode] = set()
        if self.options.per_process_batch:
            return
        reductions = LossReductions(self.script)
        backward_calls = {id(c) for c in self.script.training.backward_calls}
        for code in self.train_code():
            for call in (c for c in method_calls(code, "backward") if id(c) in backward_calls):
                loss = _loss_of(call)
                if loss is None or _already_scaled(loss):
                    continue
                kind = reductions.of(loss, self.scope_of(call) or self.script.module.tree)
                if kind is Reduction.SUM:
                    self.scaled.add(loss)
                    self.statements.add(self.statement_of(call))
                    self.changed(
                        call,
                        f"the training loss is a sum over the batch: multiplied by {WORLD_SIZE}"
                        " before backward(), so DDP's average over processes gives the"
                        " original's gradient",
                    )
                elif kind is Reduction.MIXED:
                    self.skipped(
                        "summed loss",
                        "this training loss sums over the batch and mixes the sum with other"
                        " terms: DDP averages gradients over processes and each sums only its"
                        f" share, so the summed part of every update is 1/{WORLD_SIZE} of the"
                        f" original's; multiply the summed terms by {WORLD_SIZE} by hand",
                        call,
                        wrong=True,
                    )

    def edited(self) -> list[cst.CSTNode]:
        holders = [self.parent(loss) for loss in self.scaled]  # the attribute or argument
        return [*self.planned_statements(), *self.statements, *filter(None, holders)]

    def leave_Attribute(
        self, original_node: cst.Attribute, updated_node: cst.Attribute
    ) -> cst.Attribute:
        """`loss.backward` -> `(loss * WORLD_SIZE).backward`."""
        if original_node.value not in self.scaled:
            return updated_node
        return updated_node.with_changes(
            value=_times_world_size(
                updated_node.value, lpar=[cst.LeftParen()], rpar=[cst.RightParen()]
            )
        )

    def leave_Arg(self, original_node: cst.Arg, updated_node: cst.Arg) -> cst.Arg:
        """`scaler.scale(loss)` -> `scaler.scale(loss * WORLD_SIZE)`."""
        if original_node.value not in self.scaled:
            return updated_node
        return updated_node.with_changes(value=_times_world_size(updated_node.value))

    def leave_SimpleStatementLine(
        self, original_node: cst.SimpleStatementLine, updated_node: cst.SimpleStatementLine
    ) -> cst.SimpleStatementLine:
        if original_node not in self.statements or original_node.trailing_whitespace.comment:
            return updated_node
        return updated_node.with_changes(
            trailing_whitespace=cst.TrailingWhitespace(
                whitespace=cst.SimpleWhitespace("  "), comment=cst.Comment(COMMENT)
            )
        )


def _times_world_size(loss: cst.BaseExpression, **parens: list) -> cst.BinaryOperation:
    return cst.BinaryOperation(loss, cst.Multiply(), cst.Name(WORLD_SIZE), **parens)


def _loss_of(backward: cst.Call) -> cst.BaseExpression | None:
    """The loss a `backward()` call differentiates: `loss` in `loss.backward()` and in
    `scaler.scale(loss).backward()`."""
    receiver = backward.func.value  # type: ignore[attr-defined]
    if is_method_call(receiver, "scale") and len(receiver.args) == 1:
        return receiver.args[0].value
    return receiver


def _already_scaled(loss: cst.BaseExpression) -> bool:
    return is_binary(loss, cst.Multiply) and is_name(loss.right, WORLD_SIZE)  # type: ignore[attr-defined]
