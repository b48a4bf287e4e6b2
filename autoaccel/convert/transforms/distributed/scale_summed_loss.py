"""A training loss summed over the batch is multiplied by WORLD_SIZE before `backward()`;
a mean divided again by its batch's size is divided by the whole batch's size instead.

DDP averages gradients over processes, and each process sums over its share of the
global batch, so every update would be 1/WORLD_SIZE of the original's (pytorch/examples'
VAE sums). `(loss * WORLD_SIZE).backward()` gives back the gradient of the sum over the
whole batch: exactly the original's. A mean divided by the size of each process's share
(`criterion(out, y) / out.size(0)`, DeepLab's) is WORLD_SIZE times the original's: its
divisor becomes `out.size(0) * WORLD_SIZE`, which gives back the gradient and the printed
loss (where the module being converted divides; elsewhere refused). A loss that mixes a
sum with other terms (a mean, a regulariser) cannot be scaled as a whole: refused with its
line. With `--per-process-batch` each process sums a whole batch of its own and the
average keeps the original's scale, so nothing changes.
"""

from __future__ import annotations

import libcst as cst

from autoaccel.analysis.loss_reduction import LossReductions, Reduction
from autoaccel.convert.log import LOSS_CLOSE
from autoaccel.analysis.program import SourceModule
from autoaccel.analysis.shapes import is_binary, is_method_call, is_name, method_calls
from autoaccel.convert.transforms.distributed._base import WORLD_SIZE, DistributedStep, where

COMMENT = "# a sum: DDP averages over processes"
WIDENED_COMMENT = "# DDP: the whole batch's size"
PARENS: dict[str, list] = {"lpar": [cst.LeftParen()], "rpar": [cst.RightParen()]}
REFUSED = {
    Reduction.MIXED: "this training loss mixes a sum over the batch (or a mean divided by the"
    " batch's size) with other terms: DDP averages gradients over processes and each computes"
    f" those terms over its share only, so their part of every update is 1/{WORLD_SIZE} of the"
    f" original's (a sum) or {WORLD_SIZE} times it (a mean divided by the batch's size); scale"
    f" those terms by hand (multiply a sum by {WORLD_SIZE}, divide the other by it)",
    Reduction.SCALED: "this training loss sums over the batch and divides the sum by a number"
    " not known to be the size of that batch (a constant, the dataset's size): DDP averages"
    " gradients over processes and each sums only its share, so every update is"
    f" 1/{WORLD_SIZE} of the original's if that number stays as it was; multiply the loss by"
    f" {WORLD_SIZE} by hand",
}
EITHER = (
    "this training loss is reduced differently in different branches (a sum divided by the"
    " batch's size in one, a mean in another, say): whether DDP's average over processes keeps"
    " its scale depends on the branch that runs"
    f" ({LOSS_CLOSE}: the proof run before writing compares the losses with the original's;"
    " `--no-verify` refuses)"
)
OVER_BATCH_ELSEWHERE = (
    "this training loss is a mean divided again by the batch's size at {where}, which the"
    " conversion does not edit for it: each process divides by the size of its share, so every"
    f" update is {WORLD_SIZE} times the original's; divide by that size times {WORLD_SIZE} by hand"
)
WIDENED = (
    "the training loss is a mean divided again by the batch's size, which each process takes of"
    f" its share: the divisor is multiplied by {WORLD_SIZE}, the original's batch size, so DDP's"
    " average over processes gives the original's gradient"
)


class ScaleSummedLoss(DistributedStep):
    DESCRIPTION = "Scale training losses whose scale depends on the batch size by WORLD_SIZE."
    needs = ("sum", "size_average", "size(", ".shape", "len(")  # a mean over `len(x)` too

    def visit_Module(self, node: cst.Module) -> None:
        self.scaled: set[cst.BaseExpression] = set()  # losses to multiply by WORLD_SIZE
        self.statements: dict[cst.CSTNode, str] = {}  # statements to comment
        self.widened: set[cst.BaseExpression] = set()  # batch sizes to multiply by WORLD_SIZE
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
                    self.statements[self.statement_of(call)] = COMMENT
                    self.changed(
                        call,
                        f"the training loss is a sum over the batch: multiplied by {WORLD_SIZE}"
                        " before backward(), so DDP's average over processes gives the"
                        " original's gradient",
                    )
                elif kind is Reduction.OVER_BATCH:
                    self._widen(call, reductions.batch_divisors)
                elif kind is Reduction.EITHER:
                    self.skipped("loss scale", EITHER, call, wrong=True, proof=LOSS_CLOSE)
                elif kind in REFUSED:
                    self.skipped("summed loss", REFUSED[kind], call, wrong=True)

    def _widen(
        self, call: cst.Call, divisors: list[tuple[cst.BaseExpression, SourceModule]]
    ) -> None:
        """Multiply the batch sizes a mean is divided by by WORLD_SIZE, where this
        module divides."""
        elsewhere = [where(m, d) for d, m in divisors if m is not self.script.module]
        if elsewhere:
            reason = OVER_BATCH_ELSEWHERE.format(where=", ".join(dict.fromkeys(elsewhere)))
            self.skipped("mean over the batch's size", reason, call, wrong=True)
            return
        self.widened.update(d for d, _ in divisors)
        self.statements.update((self.statement_of(d), WIDENED_COMMENT) for d, _ in divisors)
        self.changed(divisors[0][0], WIDENED)

    def edited(self) -> list[cst.CSTNode]:
        holders = [self.parent(loss) for loss in [*self.scaled, *self.widened]]
        return [*self.planned_statements(), *self.statements, *filter(None, holders)]

    def leave_Attribute(
        self, original_node: cst.Attribute, updated_node: cst.Attribute
    ) -> cst.Attribute:
        """`loss.backward` -> `(loss * WORLD_SIZE).backward`."""
        if original_node.value not in self.scaled:
            return updated_node
        return updated_node.with_changes(value=_times_world_size(updated_node.value, **PARENS))

    def leave_Arg(self, original_node: cst.Arg, updated_node: cst.Arg) -> cst.Arg:
        """`scaler.scale(loss)` -> `scaler.scale(loss * WORLD_SIZE)`; `loss.div(n)` ->
        `loss.div(n * WORLD_SIZE)`."""
        if original_node.value not in self.scaled | self.widened:
            return updated_node
        return updated_node.with_changes(value=_times_world_size(updated_node.value))

    def leave_AugAssign(
        self, original_node: cst.AugAssign, updated_node: cst.AugAssign
    ) -> cst.AugAssign:
        """`loss /= n` -> `loss /= n * WORLD_SIZE`."""
        if original_node.value not in self.widened:
            return updated_node
        return updated_node.with_changes(value=_times_world_size(updated_node.value))

    def leave_BinaryOperation(
        self, original_node: cst.BinaryOperation, updated_node: cst.BinaryOperation
    ) -> cst.BinaryOperation:
        """`loss / n` -> `loss / (n * WORLD_SIZE)`."""
        if original_node.right not in self.widened:
            return updated_node
        return updated_node.with_changes(right=_times_world_size(updated_node.right, **PARENS))

    def leave_SimpleStatementLine(
        self, original_node: cst.SimpleStatementLine, updated_node: cst.SimpleStatementLine
    ) -> cst.SimpleStatementLine:
        comment = self.statements.get(original_node)
        if comment is None or original_node.trailing_whitespace.comment:
            return updated_node
        return updated_node.with_changes(
            trailing_whitespace=cst.TrailingWhitespace(
                whitespace=cst.SimpleWhitespace("  "), comment=cst.Comment(comment)
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
