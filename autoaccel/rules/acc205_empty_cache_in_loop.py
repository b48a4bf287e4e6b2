"""ACC205: `torch.cuda.empty_cache()` called in every step of a training loop."""

from __future__ import annotations

from textwrap import indent
from typing import Sequence

import libcst as cst

from autoaccel.analysis.script_model import LoopRole
from autoaccel.lint.rule import Invalid, LintRule, Replacement

EMPTY_CACHE = ("torch.cuda.empty_cache", "torch.cuda.memory.empty_cache")
_STEP = "import torch\nfor x, y in loader:\n    loss = model(x).sum()\n    loss.backward()\n"


class EmptyCacheInLoop(LintRule):
    code = "ACC205"
    name = "empty-cache-in-loop"
    message = (
        "`torch.cuda.empty_cache()` in every training step hands cached GPU memory back to the "
        "driver, so the next step allocates it again with synchronising `cudaMalloc` calls"
    )
    fix_title = "Remove the `torch.cuda.empty_cache()` call"

    VALID = [
        # Once, outside any loop.
        _STEP + "torch.cuda.empty_cache()\n",
        # Once per epoch, around the step loop.
        "import torch\nfor epoch in range(3):\n" + indent(_STEP, "    ")
        + "    torch.cuda.empty_cache()\n",
        # A loop that does not train (exporting pipelines, evaluating).
        "import torch\nfor name in names:\n    export(name)\n    torch.cuda.empty_cache()\n",
        # Only on some steps: after a validation run, every N steps.
        _STEP + "    if step % 100 == 0:\n        validate()\n        torch.cuda.empty_cache()\n",
        # Recovering from an out-of-memory error is what the call is for.
        _STEP + "    try:\n        step(x)\n"
        "    except torch.cuda.OutOfMemoryError:\n        torch.cuda.empty_cache()\n",
        # A function defined in a loop does not run there.
        _STEP + "    def free():\n        torch.cuda.empty_cache()\n",
        # A user's own function of the same name.
        "def empty_cache():\n    pass\n" + _STEP + "    empty_cache()\n",
        "from mylib import cuda\n" + _STEP + "    cuda.empty_cache()\n",
    ]
    INVALID = [
        Invalid(_STEP + "    torch.cuda.empty_cache()\n", fixed=_STEP),
        Invalid(
            "from torch.cuda import empty_cache\nwhile True:\n    model(x).sum().backward()\n"
            "    empty_cache()\n",
            fixed="from torch.cuda import empty_cache\nwhile True:\n    model(x).sum().backward()\n",
        ),
        Invalid(
            "import torch as t\nfor x in data:\n    model(x).sum().backward(); t.cuda.empty_cache()\n",
            fixed="import torch as t\nfor x in data:\n    model(x).sum().backward()\n",
        ),
        # Used as a value: reported, not removed.
        Invalid(_STEP + "    done = torch.cuda.empty_cache()\n"),
    ]

    def visit_Call(self, node: cst.Call) -> None:
        if not self.calls(node, *EMPTY_CACHE) or not self._runs_every_iteration(node):
            return
        self.report(node, edits=self._removal(node))

    def _runs_every_iteration(self, node: cst.Call) -> bool:
        """Whether `node` runs in every step of a training loop (not once per epoch,
        per exported pipeline or per evaluation batch)."""
        for ancestor in self.ancestors(node):
            loop = self.script.step_loops.get(ancestor)
            if loop is not None:
                return loop.role is LoopRole.TRAIN
            # An `if` runs it on some steps only (after a validation, every N steps);
            # an `except` block after a failure (freeing memory after an out-of-memory
            # error is legitimate); a nested function or class only defines code.
            if isinstance(
                ancestor,
                (
                    cst.If,
                    cst.ExceptHandler,
                    cst.ExceptStarHandler,
                    cst.FunctionDef,
                    cst.Lambda,
                    cst.ClassDef,
                ),
            ):
                return False
        return False

    def _removal(self, node: cst.Call) -> dict[cst.CSTNode, Replacement]:
        """Edits deleting the call's statement; empty when it is not a statement of its own."""
        expr = self._parent(node)
        line = self._parent(expr) if isinstance(expr, cst.Expr) else None
        if not isinstance(line, (cst.SimpleStatementLine, cst.SimpleStatementSuite)):
            return {}
        others = [small for small in line.body if small is not expr]
        if others:
            # `step(x); torch.cuda.empty_cache()`: drop it from the line.
            others[-1] = others[-1].with_changes(semicolon=cst.MaybeSentinel.DEFAULT)
            return {line: line.with_changes(body=others)}
        block = self._parent(line)
        if isinstance(line, cst.SimpleStatementSuite) or (
            isinstance(block, cst.IndentedBlock) and len(block.body) == 1
        ):
            # The block's only statement: a block cannot be empty.
            return {expr: cst.Expr(cst.Name("pass"))}
        if isinstance(block, cst.IndentedBlock) and _has_comment(line.leading_lines):
            # Keep comments written above the call: they move to the next statement
            # (or stay at the end of the block).
            body = list(block.body)
            index = body.index(line)
            del body[index]
            if index < len(body):
                following = body[index]
                body[index] = following.with_changes(
                    leading_lines=[*line.leading_lines, *following.leading_lines]
                )
                return {block: block.with_changes(body=body)}
            footer = [*line.leading_lines, *block.footer]
            return {block: block.with_changes(body=body, footer=footer)}
        return {line: cst.RemoveFromParent()}

    def _parent(self, node: cst.CSTNode) -> cst.CSTNode | None:
        return next(self.ancestors(node), None)


def _has_comment(lines: Sequence[cst.EmptyLine]) -> bool:
    return any(line.comment is not None for line in lines)
