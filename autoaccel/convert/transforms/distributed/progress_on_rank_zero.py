"""Progress bars come from rank 0 only: `tqdm(loader)` on every process drew one bar per
process over the same terminal (a text classifier's and a diffusion model's training loops,
on unseen public code). `disable=RANK != 0` keeps the loop as it is (a disabled bar still
passes its iterable through, and `bar.set_postfix(...)` still works) and draws nothing on the
other ranks. A bar that already says when it is disabled, or sits under a rank test, is left
alone; so is one whose keywords come from `**kwargs` (which may say `disable` already: a
second one is a TypeError), with a note.
"""

from __future__ import annotations

import libcst as cst

from autoaccel.analysis.rank_guards import rank_guarded
from autoaccel.analysis.shapes import find
from autoaccel.convert.transforms.distributed._base import RANK, DistributedStep
from autoaccel.cst_edit import keyword_value, set_keyword

PROGRESS_BARS = frozenset(
    f"tqdm.{module}{name}"
    for module in ("", "auto.", "autonotebook.", "notebook.", "std.", "rich.")
    for name in ("tqdm", "trange")
)


class ProgressOnRankZero(DistributedStep):
    DESCRIPTION = "Draw progress bars (tqdm) on rank 0 only."

    def visit_Module(self, node: cst.Module) -> None:
        self.bars = {
            call
            for call in find(node, cst.Call)
            if self.qualified_names(call.func) & PROGRESS_BARS
            and keyword_value(call, "disable") is None
            and not rank_guarded(call, self.ancestors(call))
        }
        for call in [c for c in self.bars if any(a.star == "**" for a in c.args)]:
            self.bars.discard(call)
            self.skipped(
                "progress bar on rank 0",
                f"its keywords come from `**`: add `disable={RANK} != 0` to them by hand (every"
                " process draws this bar)",
                call,
            )

    def edited(self) -> list[cst.CSTNode]:
        return [*self.planned_statements(), *self.bars]

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        if original_node not in self.bars:
            return updated_node
        self.changed(original_node, f"progress bar drawn on rank 0 only (`disable={RANK} != 0`)")
        return set_keyword(updated_node, "disable", f"{RANK} != 0")
