"""What a lint rule is: a small batchable visitor with a code, a message and fixes."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import TYPE_CHECKING, ClassVar

import libcst as cst
from libcst.metadata import ParentNodeProvider, PositionProvider, QualifiedNameProvider

from autoaccel.analysis.names import name_key
from autoaccel.analysis.script_model import LoopRole
from autoaccel.analysis.shapes import method_calls

if TYPE_CHECKING:
    from autoaccel.analysis.index import ModuleIndex
    from autoaccel.analysis.script_model import ScriptModel, StepLoop

Replacement = cst.CSTNode | cst.FlattenSentinel | cst.RemovalSentinel


class Applicability(Enum):
    """Ruff's split: a safe fix keeps the script's meaning; an unsafe one may change
    numerics, memory use or synchronisation, so it is applied only on request."""

    SAFE = "safe"
    UNSAFE = "unsafe"


@dataclass(frozen=True)
class Fix:
    """Node replacements (keyed by nodes of the linted tree) plus imports they need."""

    title: str
    edits: Mapping[cst.CSTNode, Replacement]
    applicability: Applicability = Applicability.SAFE
    imports: tuple[str, ...] = ()  # modules that must be imported (`import os`)


@dataclass(frozen=True)
class Diagnostic:
    """One finding, located by 1-based line and column."""

    code: str
    name: str
    message: str
    line: int
    column: int
    end_line: int
    end_column: int
    fix_title: str | None = None
    fix_applicability: Applicability | None = None
    # The edits themselves: nodes of this process's tree, dropped before a result
    # crosses to another process (see `without_edits`).
    fix: Fix | None = field(default=None, compare=False, repr=False)

    def without_edits(self) -> Diagnostic:
        return replace(self, fix=None)


@dataclass(frozen=True)
class Note:
    """A fix a rule chose not to make, and why: not a finding (lint prints nothing),
    but `convert` tells the user what it left alone."""

    code: str
    name: str
    line: int
    reason: str


@dataclass(frozen=True)
class Invalid:
    """A rule example that must be reported; `fixed` is the text after its fix."""

    source: str
    fixed: str | None = None


class LintRule(cst.BatchableCSTVisitor):
    """Base class of every rule.

    A subclass sets `code`, `name` (kebab-case, names the bad pattern), `message`
    and, when it can fix, `fix_title` and `applicability`; its `visit_*` methods
    call `self.report(node, edits=...)`. `VALID`/`INVALID` hold extra examples that
    the tests run (the main examples live in the rule's doc under `rules/`).

    The engine walks the tree once for all rules and hands each the script model and
    the module index (parents, scopes, qualified names); `get_metadata` still serves
    the declared providers, positions and scopes computed only when first asked for.
    """

    code: ClassVar[str]
    name: ClassVar[str]
    message: ClassVar[str]
    fix_title: ClassVar[str | None] = None
    applicability: ClassVar[Applicability] = Applicability.SAFE
    # When some of a safe rule's fixes are unsafe: which ones (shown in the rules table).
    unsafe_for: ClassVar[str] = ""
    # False: opt-in, as Ruff's opinionated rules; it runs only when `select` or
    # `extend-select` names its code in full (a prefix such as `ACC` does not).
    default: ClassVar[bool] = True
    VALID: ClassVar[list[str]] = []
    INVALID: ClassVar[list[Invalid]] = []

    METADATA_DEPENDENCIES = (PositionProvider, QualifiedNameProvider, ParentNodeProvider)

    def __init__(self, script: ScriptModel) -> None:
        super().__init__()
        self.script = script
        self.index: ModuleIndex = script.index  # type: ignore[assignment]
        self.diagnostics: list[Diagnostic] = []
        self.notes: list[Note] = []

    # -- helpers shared by rules --------------------------------------------------
    def qualified_names(self, node: cst.CSTNode) -> frozenset[str]:
        """Canonical names `node` refers to through an import, or as a builtin."""
        return self.index.qualified_names(node)

    def calls(self, node: cst.Call, *names: str) -> bool:
        """Whether `node` calls one of the given fully qualified names."""
        return not self.qualified_names(node.func).isdisjoint(names)

    def parent(self, node: cst.CSTNode) -> cst.CSTNode | None:
        return self.index.parent(node)

    def ancestors(self, node: cst.CSTNode) -> Iterator[cst.CSTNode]:
        return self.index.ancestors(node)

    def enclosing_step_loop(self, node: cst.CSTNode) -> StepLoop | None:
        """The innermost training/evaluation step loop around `node`, if any."""
        for ancestor in self.ancestors(node):
            if ancestor in self.script.step_loops:
                return self.script.step_loops[ancestor]
        return None

    def feeds_training_loop(self, loader: cst.Call) -> bool:
        """Whether the `DataLoader(...)` call `loader` is read by a training step loop
        of the script (under any of its names); False when nothing says so."""
        return any(
            loop.role is LoopRole.TRAIN and any(obj.node is loader for obj in loop.loaders)
            for loop in self.script.training.step_loops.values()
        )

    def trains_a_model(self) -> bool:
        """Whether a model's parameters are trained: passed to a `torch.optim`
        optimizer, or read in a training step loop (a manual update, clipping).
        Gradients of an input alone (guidance while sampling) train no model."""
        if self.script.trained:
            return True
        return any(
            name_key(call.func.value) in self.script.models  # type: ignore[attr-defined]
            for loop in self.script.step_loops.values()
            if loop.role is LoopRole.TRAIN
            for call in method_calls(loop.node, "parameters")
        )

    def note(self, node: cst.CSTNode, reason: str) -> None:
        """Say why this rule leaves `node`'s pattern alone (shown by `convert`)."""
        line = self.get_metadata(PositionProvider, node).start.line
        self.notes.append(Note(self.code, self.name, line, reason))

    def report(
        self,
        node: cst.CSTNode,
        message: str | None = None,
        *,
        edits: Mapping[cst.CSTNode, Replacement] | None = None,
        imports: tuple[str, ...] = (),
        fix_title: str | None = None,
        applicability: Applicability | None = None,
    ) -> None:
        """Record a finding at `node`; `edits` make it fixable, titled `fix_title`
        with `applicability` (the rule's own when not given)."""
        position = self.get_metadata(PositionProvider, node)
        fix = None
        if edits:
            title = fix_title or self.fix_title
            assert title is not None, f"{self.code} has edits but no fix_title"
            fix = Fix(title, edits, applicability or self.applicability, imports)
        self.diagnostics.append(
            Diagnostic(
                code=self.code,
                name=self.name,
                message=message or self.message,
                line=position.start.line,
                column=position.start.column + 1,
                end_line=position.end.line,
                end_column=position.end.column + 1,
                fix_title=fix.title if fix else None,
                fix_applicability=fix.applicability if fix else None,
                fix=fix,
            )
        )
