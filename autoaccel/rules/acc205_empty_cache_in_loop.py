"""ACC205: `torch.cuda.empty_cache()` called in every step of a training loop."""

from __future__ import annotations

from textwrap import indent

import libcst as cst

from autoaccel.analysis.script_model import LoopRole
from autoaccel.lint.removal import call_statement_removal
from autoaccel.lint.rule import Invalid, LintRule

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
        "import torch\nfor epoch in range(3):\n"
        + indent(_STEP, "    ")
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
        self.report(node, edits=call_statement_removal(self, node))

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
