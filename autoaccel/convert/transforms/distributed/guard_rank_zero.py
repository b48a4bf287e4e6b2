"""Only rank 0 prints, saves checkpoints and writes files.

Each such statement (adjacent ones together) goes under `if RANK == 0:`; a function that
does nothing but write returns early on the other ranks. Statements already guarded by a
rank test are left alone. See `autoaccel.analysis.side_effects` for what counts.
"""

from __future__ import annotations

import libcst as cst

from autoaccel.analysis.shapes import name_calls
from autoaccel.analysis.side_effects import EffectKind, SideEffect, find_side_effects
from autoaccel.convert.transforms.distributed._base import (
    RANK,
    DistributedStep,
    parse_statements,
    rank_zero,
)
from autoaccel.cst_edit import is_docstring


class GuardRankZero(DistributedStep):
    DESCRIPTION = "Print, save and write files on rank 0 only."
    code = "ACC403"
    # Functions that every process must call (`--to fsdp` gathers shards for a save): a
    # writer function that calls one runs on every rank, its writes guarded one by one.
    collectives: tuple[str, ...] = ()

    def runs_on_every_rank(self, module: cst.Module, function: cst.FunctionDef) -> bool:
        """Whether the writer `function` must run on every rank (its writes guarded one
        by one) rather than return early on the others."""
        return bool(self.collectives and name_calls(function, *self.collectives))

    def visit_Module(self, node: cst.Module) -> None:
        found = find_side_effects(node, self.script.index)
        writers = {f for f in found.writer_functions if not self.runs_on_every_rank(node, f)}
        for function in writers:
            self._return_early(function)
        groups: dict[cst.CSTNode, list[SideEffect]] = {}
        for effect in found.effects:
            if effect.guarded or effect.function in writers:
                continue
            if effect.statement is None:
                self.skipped(
                    f"rank-0 {effect.kind.value}",
                    f"the {effect.kind.value} is part of an expression; run it on rank 0 only"
                    f" (`if {RANK} == 0:`) by hand",
                    effect.call,
                    wrong=effect.kind is not EffectKind.PRINT,  # processes racing on one file
                )
                continue
            groups.setdefault(effect.statement, []).append(effect)
        self._guard(groups)

    def _return_early(self, function: cst.FunctionDef) -> None:
        body = cst.ensure_type(function.body, cst.IndentedBlock).body
        first = body[1] if len(body) > 1 and is_docstring(body[0]) else body[0]
        self.before.setdefault(first, []).extend(
            parse_statements(f"if {RANK} != 0:\n    return  # only rank 0 writes\n")
        )
        self.changed(function, f"`{function.name.value}()` writes on rank 0 only")

    def _guard(self, groups: dict[cst.CSTNode, list[SideEffect]]) -> None:
        """One `if RANK == 0:` per run of adjacent statements of a block."""
        runs: list[list[cst.BaseStatement]] = []
        for statement in groups:
            block = self.parent(statement)
            siblings = list(block.body)  # type: ignore[union-attr]
            index = siblings.index(statement)
            if runs and runs[-1][-1] in siblings and siblings.index(runs[-1][-1]) == index - 1:
                runs[-1].append(statement)  # type: ignore[arg-type]
            else:
                runs.append([statement])  # type: ignore[list-item]
        for run in runs:
            self.replace[run[0]] = [rank_zero(run)]
            for statement in run[1:]:
                self.replace[statement] = []
            kinds = sorted({e.kind.value for s in run for e in groups[s]})
            code = "ACC403" if any(e.kind is EffectKind.CHECKPOINT for s in run for e in groups[s]) else "ddp"
            self.changed(run[0], f"{' and '.join(kinds)} on rank 0 only", code)
