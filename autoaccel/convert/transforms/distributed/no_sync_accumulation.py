"""Gradient accumulation under DDP: no all-reduce on the micro-steps that do not update.

In a training step loop that calls `backward()` every step but `optimizer.step()` only
under a condition, the forward and backward run under `ddp_model.no_sync()` unless the
condition holds; the condition is computed once, before them. The backward pass may be
in a method the loop calls (`loss = self.training_step(x, y)`, in a Trainer whose
`self.ddp_model` that method runs): the call then runs under `no_sync()`. A loop whose
micro-steps cannot be put under it is listed as not changed, with the reason.
"""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from autoaccel.analysis.names import name_key
from autoaccel.analysis.shapes import find, method_calls
from autoaccel.convert.transforms.distributed._base import (
    DISTRIBUTED,
    DistributedStep,
    Statements,
    parse_statements,
)
from autoaccel.cst_edit import code_of

SYNC = "sync_gradients"
_BACKWARD = m.SimpleStatementLine(
    body=[m.Expr(value=m.Call(func=m.Attribute(attr=m.Name("backward"))))]
)


class NoSyncAccumulation(DistributedStep):
    DESCRIPTION = "Skip the gradient all-reduce on accumulation micro-steps (no_sync)."
    needs = (".step(",)
    code = "ACC404"

    def visit_Module(self, node: cst.Module) -> None:
        wrappers = self.ddp_wrappers(node)
        for loop in self.train_loops():
            if isinstance(loop.body, cst.IndentedBlock):
                self._plan(loop, list(loop.body.body), wrappers)

    def _plan(self, loop: cst.CSTNode, body: Statements, wrappers: set[str]) -> None:
        steps = [
            i
            for i, s in enumerate(body)
            # `if use_optimizer: optimizer.step() else: <manual update>` updates every step
            if isinstance(s, cst.If)
            and s.orelse is None
            and any(
                name_key(c.func.value) in self.script.optimizers  # type: ignore[attr-defined]
                for c in method_calls(s.body, "step")
            )
        ]
        if len(steps) != 1 or method_calls(loop, "no_sync"):
            return  # the optimizer steps every iteration, or the user chose already
        backwards = [
            i
            for i, s in enumerate(body)
            if m.matches(s, _BACKWARD) or (i < steps[0] and self.script.backpropagates(s))
        ]
        if not backwards:
            self.skipped(
                "no_sync",
                "gradient accumulation: the backward pass is not a statement of the loop;"
                " run the micro-steps that do not update under `ddp_model.no_sync()` by hand",
                loop,
            )
            return
        if backwards[-1] > steps[0]:
            return  # not accumulation: the optimizer steps before the backward pass
        used = [
            (i, key)
            for i, s in enumerate(body[: backwards[-1] + 1])
            for key in self._wrappers_run(s, wrappers, loop)
        ]
        condition = body[steps[0]]
        assert isinstance(condition, cst.If)
        first, last = (used[0][0] if used else None), backwards[-1]
        assigned = {
            name_key(t.target)
            for s in body[first or 0 : last + 1]
            for t in find(s, cst.AssignTarget)
        }
        tested = {n.value for n in find(condition.test, cst.Name)}
        # `do_step = (i + 1) % accumulation == 0` between the backward and the `if`
        # moves above the forward, where the condition is computed
        moved = [s for s in body[last + 1 : steps[0]] if _assigns(s) & tested]
        if (
            first is None
            or len({key for _, key in used}) != 1
            or tested & assigned
            or not all(_movable(s, assigned) for s in moved)
        ):
            self.skipped(
                "no_sync",
                "gradient accumulation: run the forward and backward of the micro-steps that"
                " do not update under `ddp_model.no_sync()` by hand",
                loop,
            )
            return
        wrapper = used[0][1]
        head = parse_statements(
            "# all-reduce the gradients only on the micro-step that updates the weights\n"
            f"{SYNC} = {code_of(condition.test)}\n"
            f"no_sync = {DISTRIBUTED} and not {SYNC}\n"
            f"with {wrapper}.no_sync() if no_sync else contextlib.nullcontext():\n"
            "    pass\n"
        )
        block = body[first : last + 1]
        with_node = cst.ensure_type(head[-1], cst.With)
        head[-1] = with_node.with_changes(
            body=cst.IndentedBlock(body=[block[0].with_changes(leading_lines=[]), *block[1:]])
        )
        head = [*moved, *head]  # each moved statement with its comments
        opening = cst.ensure_type(head[0], cst.SimpleStatementLine)  # moved or inserted
        kept = [line for line in opening.leading_lines if line.comment is not None]
        head[0] = opening.with_changes(leading_lines=[*block[0].leading_lines, *kept])
        self.replace[body[first]] = head
        for statement in [*block[1:], *moved]:
            self.replace[statement] = []
        self.replace[condition] = [condition.with_changes(test=cst.Name(SYNC))]
        self.imports.append("import contextlib")
        self.changed(
            body[first],
            f"accumulation micro-steps run under `{wrapper}.no_sync()`: gradients are"
            " all-reduced only before `optimizer.step()`",
        )

    def _wrappers_run(
        self, statement: cst.CSTNode, wrappers: set[str], loop: cst.CSTNode
    ) -> set[str]:
        """The DDP wrappers `statement` calls: itself, or through a method of the loop's
        own class it calls on `self` (`self.training_step(x, y)` running `self.ddp_model`,
        which the loop reaches as `self.ddp_model` too)."""
        found = {key for c in find(statement, cst.Call) if (key := name_key(c.func)) in wrappers}
        own = self._class_of(loop)
        for call in find(statement, cst.Call):
            key = name_key(call.func)
            if own is None or key is None or not key.startswith("self."):
                continue
            for function in self.script.callees(call):
                if function.cls is own and function.module is self.script.module:
                    found |= {
                        wrapper
                        for c in find(function.node.body, cst.Call)
                        if (wrapper := name_key(c.func)) in wrappers and wrapper.startswith("self.")
                    }
        return found

    def _class_of(self, loop: cst.CSTNode):
        """The class whose method holds `loop` (None for a function or the module)."""
        step = self.script.step_loops.get(loop)
        function = step.function if step is not None else None
        return function.cls if function is not None and function.is_method else None


def _assigns(statement: cst.CSTNode) -> set[str]:
    """The names `statement` assigns."""
    return {name_key(t.target) for t in find(statement, cst.AssignTarget)} - {None}  # type: ignore[return-value]


def _movable(statement: cst.CSTNode, assigned: set[str | None]) -> bool:
    """Whether `statement` (`do_step = ...`) can run before the forward: one assignment
    of a value that calls nothing but `len` and reads nothing the micro-step assigns."""
    if not m.matches(statement, m.SimpleStatementLine(body=[m.Assign()])):
        return False
    value = statement.body[0].value  # type: ignore[attr-defined]
    reads = {n.value for n in find(value, cst.Name)}
    calls = find(value, cst.Call)
    return all(m.matches(c.func, m.Name("len")) for c in calls) and not reads & assigned
