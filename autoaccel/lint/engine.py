"""Lint one source text: parse once, analyse once, run every rule in one traversal."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import libcst as cst
from libcst.metadata import (
    MetadataWrapper,
    ParentNodeProvider,
    PositionProvider,
    QualifiedNameProvider,
)

from autoaccel.analysis.index import ModuleIndex, run_visitors
from autoaccel.analysis.program import SourceModule
from autoaccel.analysis.project import SCRIPT, entry_projects, load_project
from autoaccel.analysis.positions import Positions, SourcePositions
from autoaccel.analysis.script_model import ProjectContext, ScriptModel, build_script_model
from autoaccel.config import LintSettings
from autoaccel.lint.noqa import is_suppressed, suppressions
from autoaccel.lint.rule import Diagnostic, LintRule, Note
from autoaccel.rules import all_rules
from autoaccel.source import checked_syntax_tree, might_use_torch, parse_checked


@dataclass
class Analysis:
    """A parsed file with its metadata and the (unsuppressed) findings of the rules."""

    module: cst.Module
    wrapper: MetadataWrapper | None
    positions: Positions
    diagnostics: list[Diagnostic] = field(default_factory=list)
    notes: list[Note] = field(default_factory=list)
    project: ProjectContext | None = None  # what the module was analysed with
    index: ModuleIndex | None = None  # of `module`, when the rules ran
    script: ScriptModel | None = None  # of `module`, when the rules ran


def analyse(
    source: str,
    settings: LintSettings,
    path: str | None = None,
    project: ProjectContext | None = None,
    script: Path | None = None,
    module: cst.Module | None = None,
) -> Analysis:
    """Run the enabled rules over `source` (a module of `project`, when given: the
    rules then see the objects and loops of its other modules; or the text of the
    file `script`, analysed as a module of the entry scripts that import it, or else
    with the local modules it imports). `module`: `source` parsed by LibCST already,
    each node object once. Raises `SourceError` when it does not parse."""
    rules = [
        rule
        for rule in all_rules()
        if settings.enabled(rule.code, path) and (rule.default or settings.names(rule.code))
    ]
    if project is None and script is not None:
        project = _importing_project(script)
    # A module of a project is analysed with torch or without: the objects it handles
    # (a model, a loader, a device) come from the modules that call it.
    if project is None and not might_use_torch(source):
        empty = cst.Module(body=[])
        return Analysis(module=empty, wrapper=None, positions=Positions(empty))
    if module is None:
        module, tree = parse_checked(source)
    else:
        tree = checked_syntax_tree(source)
    if not rules:
        return Analysis(module=module, wrapper=None, positions=Positions(module))
    wrapper = MetadataWrapper(module, unsafe_skip_copy=True)
    index = ModuleIndex(module)
    if project is None and script is not None:
        project = _imported_project(script, module, index)
    # Computed when a rule first reports.
    positions = (
        Positions(module) if tree is None else SourcePositions(module, source, tree, index.parents)
    )
    script = build_script_model(wrapper, index, project)
    metadata = {
        ParentNodeProvider: index.parents,
        PositionProvider: positions,
        # Resolved by LibCST only when a rule first asks.
        QualifiedNameProvider: _Lazy(wrapper, QualifiedNameProvider),
    }
    visitors: list[LintRule] = [rule(script) for rule in rules]
    for visitor in visitors:
        visitor.metadata = metadata  # type: ignore[assignment]
    run_visitors(module, visitors)
    noqa = suppressions(source)
    diagnostics = sorted(
        (
            diagnostic
            for visitor in visitors
            for diagnostic in visitor.diagnostics
            if not _suppressed(diagnostic, noqa)
        ),
        key=lambda d: (d.line, d.column, d.code),
    )
    notes = [note for visitor in visitors for note in visitor.notes]
    return Analysis(
        module=module,
        wrapper=wrapper,
        positions=positions,
        diagnostics=_unique(diagnostics),
        notes=notes,
        project=project,
        index=index,
        script=script,
    )


def _importing_project(path: Path) -> ProjectContext | None:
    """The file at `path` as a module of the programs of the entry scripts that import it
    (None when none does): `trainer.py`, whose `Trainer` gets its model, device and
    loaders from `train.py`, is analysed with what `train.py` passes."""
    entries = entry_projects(path)
    if not entries:
        return None
    name, package = entries[0][1].name, entries[0][1].package
    others: dict[int, SourceModule] = {}
    for project, module in entries:
        if module.name != name:
            continue  # imported under another name: another program
        for other in project.all_modules:
            if other is not module:
                others.setdefault(id(other), other)
    return ProjectContext(name, package, str(path), tuple(others.values()))


def _imported_project(script: Path, tree: cst.Module, index: ModuleIndex) -> ProjectContext | None:
    """`script` as the entry of a program with the local modules it imports (None when
    it imports none): a step whose loop is here and whose backward pass is in an
    imported `trainer.py` is a training step of this file."""
    imported = load_project(script, tree, index).modules
    return (
        ProjectContext(SCRIPT, path=str(script), others=tuple(imported.values()))
        if imported
        else None
    )


class _Lazy(Mapping):
    """A LibCST provider's results, computed on first use."""

    def __init__(self, wrapper: MetadataWrapper, provider: type) -> None:
        self._wrapper = wrapper
        self._provider = provider

    def _resolved(self) -> Mapping:
        return self._wrapper.resolve(self._provider)

    def __getitem__(self, node: cst.CSTNode) -> object:
        return self._resolved()[node]

    def __iter__(self):
        return iter(self._resolved())

    def __len__(self) -> int:
        return len(self._resolved())


def _suppressed(diagnostic: Diagnostic, noqa: dict[int, frozenset[str]]) -> bool:
    """A `# noqa` on the first or the last line of the finding counts: black puts the
    comment of a call it splits after the closing bracket, and a fix must not lose it."""
    return is_suppressed(diagnostic.code, diagnostic.line, noqa) or is_suppressed(
        diagnostic.code, diagnostic.end_line, noqa
    )


def _unique(diagnostics: list[Diagnostic]) -> list[Diagnostic]:
    """Drop repeats (a rule visiting the same node through two paths)."""
    seen: set[Diagnostic] = set()
    unique = []
    for diagnostic in diagnostics:
        if diagnostic not in seen:
            seen.add(diagnostic)
            unique.append(diagnostic)
    return unique


def lint_source(source: str, settings: LintSettings, path: str | None = None) -> list[Diagnostic]:
    """The findings for `source`, sorted by position."""
    return analyse(source, settings, path).diagnostics
