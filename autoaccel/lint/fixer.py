"""Apply rule fixes until the file is stable, then re-lint what remains."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import libcst as cst
from libcst.metadata import CodeRange

from autoaccel.config import LintSettings
from autoaccel.cst_edit import add_imports
from autoaccel.diff import original_line
from autoaccel.formatting import format_inserted_code, format_inserted_statements
from autoaccel.analysis.index import repeats_a_node
from autoaccel.analysis.script_model import ProjectContext, ScriptModel
from autoaccel.lint.engine import Analysis, analyse
from autoaccel.lint.rule import Applicability, Diagnostic, Fix, Note, Replacement
from autoaccel.module_code import ModuleCode
from autoaccel.source import SourceError

MAX_ROUNDS = 10


@dataclass
class FixResult:
    source: str
    fixed: list[Diagnostic]
    remaining: list[Diagnostic]
    notes: list[Note]  # lines of the original source
    module: cst.Module | None = None  # `source` parsed, each node object once, when it was
    script: ScriptModel | None = None  # the script model of `module`, when the rules ran


def is_applicable(diagnostic: Diagnostic, settings: LintSettings) -> bool:
    fix = diagnostic.fix
    return fix is not None and (
        fix.applicability is Applicability.SAFE or settings.applies_unsafe_fixes(diagnostic.code)
    )


def fix_source(
    source: str,
    settings: LintSettings,
    path: str | None = None,
    project: ProjectContext | None = None,
    script: Path | None = None,
    module: cst.Module | None = None,
    module_code: ModuleCode | None = None,
) -> FixResult:
    """Apply every applicable fix; overlapping fixes wait for the next round. `project`,
    `script` and `module` (`source` parsed): as `analyse` takes them; `module_code`
    generates the code of the fixed trees (a caller's, to share what it knows)."""
    module_code = module_code or ModuleCode()
    fixed: list[Diagnostic] = []
    history: list[tuple[str, str]] = []  # texts of the rounds, to report original lines
    analysis = analyse(source, settings, path, project, script, module)
    project = analysis.project  # the imported modules are read once
    for _ in range(MAX_ROUNDS):
        chosen = _non_overlapping(analysis, settings)
        if not chosen:
            break
        new_module, new_source = _apply(source, analysis, [d.fix for d in chosen], module_code)  # type: ignore[misc]
        if new_source == source:
            break
        try:
            next_analysis = analyse(new_source, settings, path, project, module=new_module)
        except SourceError:
            # A fix that breaks the syntax is a bug in the rule; keep the last good text.
            break
        fixed.extend(replace(d, line=original_line(history, d.line)) for d in chosen)
        history.append((source, new_source))
        source, analysis = new_source, next_analysis
    notes = [replace(n, line=original_line(history, n.line)) for n in analysis.notes]
    parsed = analysis.module if analysis.wrapper is not None else None  # analysed: parsed
    return FixResult(source, fixed, analysis.diagnostics, notes, parsed, analysis.script)


def _non_overlapping(analysis: Analysis, settings: LintSettings) -> list[Diagnostic]:
    positions = analysis.positions
    taken: list[CodeRange] = []
    chosen = []
    for diagnostic in analysis.diagnostics:
        if not is_applicable(diagnostic, settings):
            continue
        ranges = [positions[node] for node in diagnostic.fix.edits]  # type: ignore[union-attr]
        if any(_overlaps(r, t) for r in ranges for t in taken):
            continue
        taken.extend(ranges)
        chosen.append(diagnostic)
    return chosen


def _overlaps(a: CodeRange, b: CodeRange) -> bool:
    return (a.start.line, a.start.column) < (b.end.line, b.end.column) and (
        b.start.line,
        b.start.column,
    ) < (a.end.line, a.end.column)


class _ApplyEdits(cst.CSTTransformer):
    """Replaces the nodes of `edits`, visiting only the nodes in `around` (those that
    hold an edited node): nothing else can change."""

    def __init__(self, edits: dict[cst.CSTNode, Replacement], around: set[cst.CSTNode]) -> None:
        super().__init__()
        self.edits = edits
        self.around = around

    def on_visit(self, node: cst.CSTNode) -> bool:
        return node in self.around

    def on_leave(
        self, original_node: cst.CSTNode, updated_node: cst.CSTNode
    ) -> cst.CSTNode | cst.RemovalSentinel | cst.FlattenSentinel:
        replacement = self.edits.get(original_node, updated_node)
        if isinstance(replacement, (cst.If, cst.For, cst.While)):
            return _without_emptied_else(replacement)
        return replacement


def _without_emptied_else(node: cst.If | cst.For | cst.While) -> cst.If | cst.For | cst.While:
    """`node` without its `else:` block when fixes removed every statement of it (LibCST
    would write `else: pass`), unless a comment sits there."""
    orelse = node.orelse
    if not isinstance(orelse, cst.Else) or not isinstance(orelse.body, cst.IndentedBlock):
        return node
    block = orelse.body
    if (
        block.body
        or block.header.comment
        or any(line.comment for line in (*orelse.leading_lines, *block.footer))
    ):
        return node
    return node.with_changes(orelse=None)


def _apply(
    source: str, analysis: Analysis, fixes: list[Fix], module_code: ModuleCode
) -> tuple[cst.Module | None, str]:
    """`source` (as `analysis` parsed it) with `fixes` applied: its tree, when no node
    object sits in it twice (None: parse the code), and its code."""
    edits: dict[cst.CSTNode, Replacement] = {}
    imports: list[str] = []
    for fix in fixes:
        edits.update(fix.edits)
        imports.extend(fix.imports)
    index = analysis.index
    assert index is not None  # the rules ran: they found the fixes
    around = {ancestor for node in edits for ancestor in index.ancestors(node)}
    new_module = analysis.module.visit(_ApplyEdits(edits, around))
    if imports:
        new_module = add_imports(new_module, tuple(imports))
    if repeats_a_node(new_module):
        return None, format_inserted_code(source, new_module.code)
    return format_inserted_statements(source, new_module, module_code(new_module), module_code)
