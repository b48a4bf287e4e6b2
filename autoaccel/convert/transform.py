"""The base of every convert transform: a LibCST codemod that does one thing.

Transforms read the options and write their changes through `context.scratch`,
see the shared `ScriptModel` of the tree they receive as `self.script`, and must
be idempotent: run on their own output they change nothing.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import libcst as cst
from libcst.codemod import CodemodContext, VisitorBasedCodemodCommand
from libcst.metadata import CodeRange, MetadataWrapper

from autoaccel.analysis.positions import Positions
from autoaccel.analysis.script_model import ScriptModel, build_script_model
from autoaccel.convert.log import Change, ConversionLog, ConvertOptions, Skipped

OPTIONS_KEY = "autoaccel.options"
LOG_KEY = "autoaccel.log"
SOURCE_KEY = "autoaccel.source"
ORIGIN_KEY = "autoaccel.origin"
# Set when the module is one file of a project conversion: a `ProjectContext` (see
# `autoaccel.convert.project_conversion`) and whether the module is the entry script.
PROJECT_KEY = "autoaccel.project"
ENTRY_KEY = "autoaccel.entry"


def new_context(
    options: ConvertOptions,
    log: ConversionLog,
    path: str | None = None,
    source: str | None = None,
    origin: str | None = None,
) -> CodemodContext:
    """The context of one step; `path` names the script (launch commands use it),
    `source` is the code of the tree the step gets, when the caller has it, `origin`
    the file it was read from (its project's modules are found from there)."""
    scratch = {OPTIONS_KEY: options, LOG_KEY: log, SOURCE_KEY: source, ORIGIN_KEY: origin}
    return CodemodContext(filename=path, scratch=scratch)


def source_of(context: CodemodContext, tree: cst.Module) -> str:
    """The code of `tree`, the module a step is given: from the context when the
    pipeline passed it along (code generation costs a pass over the tree)."""
    source = context.scratch.get(SOURCE_KEY)
    return tree.code if source is None else source


class Transform(VisitorBasedCodemodCommand):
    """One rewrite step. Subclasses set `DESCRIPTION` and `code` (the rule code the
    change is reported under) and implement `leave_*` methods."""

    code: str = ""
    # Names and parents come from the script model's index (one walk), positions only
    # when a change is logged: LibCST's providers would cost a pass each per step.
    METADATA_DEPENDENCIES = ()
    # A step that only logs ("Not changed" items) from `visit_Module` and never edits:
    # it reads the tree as it is, without LibCST's copy and transform pass (~0.15 s).
    reports_only: bool = False

    def __init__(self, context: CodemodContext) -> None:
        super().__init__(context)
        self.script: ScriptModel = ScriptModel()
        self._positions: Positions | None = None

    @property
    def options(self) -> ConvertOptions:
        return self.context.scratch[OPTIONS_KEY]

    @property
    def log(self) -> ConversionLog:
        return self.context.scratch[LOG_KEY]

    @property
    def in_entry_script(self) -> bool:
        """Whether this module is the script that runs (not a module it imports)."""
        return self.context.scratch.get(ENTRY_KEY, True)

    @classmethod
    def enabled(cls, options: ConvertOptions) -> bool:
        """Whether the options ask for this step (default: always)."""
        return True

    def transform_module(self, tree: cst.Module) -> cst.Module:
        if not self.reports_only:
            return super().transform_module(tree)
        self.context = replace(self.context, wrapper=MetadataWrapper(tree, unsafe_skip_copy=True))
        self._analyse()
        self.visit_Module(tree)
        return tree

    def transform_module_impl(self, tree: cst.Module) -> cst.Module:
        self._analyse()
        return super().transform_module_impl(tree)

    def _analyse(self) -> None:
        """The script model of the tree in `context.wrapper`; positions reset."""
        assert self.context.wrapper is not None
        self.script = build_script_model(self.context.wrapper, project=self.context.scratch.get(PROJECT_KEY))
        self._positions = None

    def qualified_names(self, node: cst.CSTNode) -> frozenset[str]:
        """Canonical names `node` refers to through an import, or as a builtin."""
        assert self.script.index is not None
        return self.script.index.qualified_names(node)

    def parent(self, node: cst.CSTNode) -> cst.CSTNode | None:
        assert self.script.index is not None
        return self.script.index.parent(node)

    def ancestors(self, node: cst.CSTNode) -> Iterator[cst.CSTNode]:
        assert self.script.index is not None
        return self.script.index.ancestors(node)

    def position_of(self, node: cst.CSTNode) -> CodeRange:
        """Where `node` is (computed for the whole tree on the first call)."""
        if self._positions is None:
            assert self.context.wrapper is not None
            self._positions = Positions(self.context.wrapper.module)
        return self._positions[node]

    def line_of(self, node: cst.CSTNode) -> int:
        return self.position_of(node).start.line

    def changed(self, node: cst.CSTNode, description: str, code: str | None = None) -> None:
        self.log.changes.append(Change(code or self.code, self.line_of(node), description))

    def skipped(
        self, what: str, reason: str, node: cst.CSTNode | None = None, *, wrong: bool = False
    ) -> None:
        """Log a rewrite not made; `wrong`: the result trains wrongly without it."""
        line = self.line_of(node) if node is not None else None
        self.log.skipped.append(Skipped(what, line, reason, wrong))


class StatementRewrite(Transform):
    """A transform that edits whole statements: `rebuild` maps the statements of each
    block (a module or an indented body) to their replacements, keyed by the originals."""

    def rebuild(self, originals: list, updated: list) -> list:
        raise NotImplementedError

    def leave_IndentedBlock(
        self, original_node: cst.IndentedBlock, updated_node: cst.IndentedBlock
    ) -> cst.IndentedBlock:
        return updated_node.with_changes(
            body=self.rebuild(list(original_node.body), list(updated_node.body))
        )
