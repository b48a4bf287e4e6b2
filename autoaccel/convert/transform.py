"""The base of every convert transform: a LibCST codemod that does one thing.

Transforms read the options and write their changes through their `StepContext`,
see the shared `ScriptModel` of the tree they receive as `self.script`, and must
be idempotent: run on their own output they change nothing.
"""

from __future__ import annotations

from collections.abc import Generator, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any

import libcst as cst
import libcst.matchers as m
from libcst.codemod import Codemod, CodemodContext, VisitorBasedCodemodCommand
from libcst.metadata import CodeRange, MetadataWrapper

from autoaccel.analysis.index import repeats_a_node
from autoaccel.analysis.positions import Positions, SourcePositions, TopLevelPositions
from autoaccel.analysis.script_model import ProjectContext, ScriptModel, build_script_model
from autoaccel.convert.dispatch import (
    handled_types,
    has_field_methods,
    is_token,
    method,
    touched_nodes,
)
from autoaccel.cst_internals import skip_matcher_setup, uses_matcher_decorators
from autoaccel.convert.log import Change, ConversionLog, ConvertOptions, Skipped
from autoaccel.facts.resolve import ConversionFacts, FactsResolver
from autoaccel.module_code import ModuleCode
from autoaccel.source import python_tree


@dataclass
class TreeFacts:
    """What the steps of one conversion found out about a tree, kept for the next step
    that gets the same tree (a step that changed nothing passes its input on)."""

    tree: cst.Module
    script: ScriptModel | None = None  # not kept in a project: other modules change
    positions: Positions | None = None
    repeats_a_node: bool | None = None


Analyses = dict[int, TreeFacts]  # by id() of the tree


@dataclass
class InsertedNames:
    """The names of one module's conversion that differ from the canonical ones the
    steps write (see `transforms.inserted_names`): empty where the script uses none."""

    chosen: dict[str, str] = field(default_factory=dict)  # canonical -> the conversion's
    placeholders: dict[str, str] = field(default_factory=dict)  # script's own -> meanwhile


# Where a step finds its `StepContext` in LibCST's `CodemodContext.scratch`.
STEP_KEY = "autoaccel.step"


@dataclass
class StepContext:
    """What the steps over one module of a conversion share: the options, the log, the
    code of the tree a step gets when the pipeline has it (`source`), what earlier steps
    found out about the trees (`analyses`), the code generation, the names the steps
    insert, and the facts of a run of the script. `project` is set when the module is one
    file of a project conversion, `entry` says whether it is the script that runs."""

    options: ConvertOptions
    log: ConversionLog
    source: str | None = None
    analyses: Analyses = field(default_factory=dict)
    module_code: ModuleCode = field(default_factory=ModuleCode)
    inserted_names: InsertedNames = field(default_factory=InsertedNames)
    project: ProjectContext | None = None
    entry: bool = True
    facts: ConversionFacts | None = None

    def codemod_context(self, path: str | None = None) -> CodemodContext:
        """LibCST's context for a step that shares this (`path` names the script: launch
        commands use it)."""
        return CodemodContext(filename=path, scratch={STEP_KEY: self})


def new_context(
    options: ConvertOptions, log: ConversionLog, path: str | None = None
) -> CodemodContext:
    """The context of one step over a module no other step shares anything about."""
    return StepContext(options, log).codemod_context(path)


def step_context(context: CodemodContext) -> StepContext:
    """The `StepContext` of the step `context` was made for."""
    shared: StepContext = context.scratch[STEP_KEY]
    return shared


def tree_facts(context: CodemodContext, tree: cst.Module) -> TreeFacts:
    """What the steps of the conversion `context` belongs to know about `tree`."""
    analyses = step_context(context).analyses
    facts = analyses.get(id(tree))
    if facts is None or facts.tree is not tree:
        facts = analyses[id(tree)] = TreeFacts(tree)
    return facts


def source_of(context: CodemodContext, tree: cst.Module) -> str:
    """The code of `tree`, the module a step is given: from the context when the
    pipeline passed it along (code generation costs a pass over the tree)."""
    source = step_context(context).source
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
    # Text the source must contain for the step to have work (a prefilter that spares
    # the analysis and the pass); empty: always run.
    needs: tuple[str, ...] = ()
    # A step that only renames names: its output goes on as it is, not formatted.
    renames_names: bool = False

    def __init__(self, context: CodemodContext) -> None:
        # LibCST's matcher decorators (`@m.leave(...)`, `@m.call_if_inside(...)`) are
        # checked at every node, ~4x the cost of the pass itself, and gathered with three
        # `dir()` scans of the instance (~13 ms; ~0.3 s for the first conversion of a
        # process). A class without them skips both: it finds its `visit_*` / `leave_*`
        # methods in a table per class.
        decorated = uses_matcher_decorators(type(self))
        if decorated:
            super().__init__(context)
        else:
            Codemod.__init__(self, context)
            cst.CSTTransformer.__init__(self)
            skip_matcher_setup(self)
        self._decorated = decorated
        self._touched: set[cst.CSTNode] | None = None  # None: visit every node
        # How many nodes `leave_*` methods replaced so far, and that count when each node
        # being visited was entered: a node with no replacement below it leaves the pass
        # as the very object it was, so the next steps (code generation, analyses) can
        # tell it unchanged. An unchanged tree is passed on as it is. (Not where the
        # class's own `on_leave` hook may replace nodes unseen.)
        self._edits = 0
        self._entered: list[int] = []
        self._keeps_nodes = type(self).on_leave is Transform.on_leave
        if not decorated and not has_field_methods(type(self)):
            # LibCST calls these around every field of every node it visits (~700,000
            # calls a conversion): no-ops found on the instance, without a method lookup.
            self.on_visit_attribute = self.on_leave_attribute = _no_field_hook  # type: ignore[method-assign]
        self.script: ScriptModel = ScriptModel()
        self._positions: Positions | None = None

    def on_visit(self, node: cst.CSTNode) -> bool:
        if self._decorated:
            return super().on_visit(node)
        if self._touched is not None and node not in self._touched:
            # A token holds no node the step has a method for; any other node of the
            # indexed tree outside `_touched` holds none either, or none it edits.
            if is_token(type(node)) or self._indexed(node):
                self._entered.append(_SKIPPED)
                return False
        self._entered.append(self._edits)
        visit = method(type(self), "visit_", type(node))
        visit_children = visit is None or visit(self, node) is not False
        if type(node) is cst.Module and self._touched is not None:
            self._touch_edited_only()
        return visit_children

    def edited(self) -> Iterable[cst.CSTNode] | None:
        """The nodes the `leave_*` methods replace, once `visit_Module` planned them
        (None: unknown). A step that plans every edit there and visits no other node
        for what it learns says so: its pass then visits only the way to those nodes."""
        return None

    def _touch_edited_only(self) -> None:
        edited = self.edited()
        index = self.script.index
        if edited is None or index is None:
            return
        touched: set[cst.CSTNode] = {index.module}
        for node in edited:
            while node is not None and node not in touched:
                touched.add(node)
                node = index.parents.get(node)
        self._touched = touched

    def on_leave(self, original_node: cst.CSTNode, updated_node: cst.CSTNode) -> Any:
        if self._decorated:
            return super().on_leave(original_node, updated_node)
        entered = self._entered.pop()
        if entered == _SKIPPED:
            return original_node  # no method of the step's acts there
        unchanged = entered == self._edits
        leave = method(type(self), "leave_", type(original_node))
        if leave is not None:
            result = leave(self, original_node, updated_node)
            if result is not updated_node:
                self._edits += 1
                return result
        return original_node if unchanged and self._keeps_nodes else updated_node

    def on_visit_attribute(self, node: cst.CSTNode, attribute: str) -> None:
        if self._decorated:
            return super().on_visit_attribute(node, attribute)
        visit = method(type(self), "visit_", type(node), attribute)
        if visit is not None:
            visit(self, node)
        return None

    def on_leave_attribute(self, original_node: cst.CSTNode, attribute: str) -> None:
        if self._decorated:
            return super().on_leave_attribute(original_node, attribute)
        leave = method(type(self), "leave_", type(original_node), attribute)
        if leave is not None:
            leave(self, original_node)
        return None

    @property
    def step_context(self) -> StepContext:
        return step_context(self.context)

    @property
    def options(self) -> ConvertOptions:
        return self.step_context.options

    @property
    def log(self) -> ConversionLog:
        return self.step_context.log

    @property
    def inserted_names(self) -> InsertedNames:
        return self.step_context.inserted_names

    @property
    def in_entry_script(self) -> bool:
        """Whether this module is the script that runs (not a module it imports)."""
        return self.step_context.entry

    def run_facts(self) -> FactsResolver | None:
        """The facts of a short run of the script (`autoaccel.facts`), for this module's
        tree, when the conversion has them and this module is the script that ran."""
        given = self.step_context.facts
        index = self.script.index
        if given is None or index is None or not self.in_entry_script:
            return None
        return given.resolver(index.module, self.position_of)

    def module_facts(self) -> FactsResolver | None:
        """The facts of a short run of the script for this module's tree, the script's or
        another module's of its project, when the conversion has them."""
        given = self.step_context.facts
        index = self.script.index
        if given is None or index is None:
            return None
        path = None if self.in_entry_script else self.context.filename
        return given.resolver(index.module, self.position_of, path)

    @classmethod
    def enabled(cls, options: ConvertOptions) -> bool:
        """Whether the options ask for this step (default: always)."""
        return True

    def transform_module(self, tree: cst.Module) -> cst.Module:
        if self.needs and not any(word in source_of(self.context, tree) for word in self.needs):
            return tree
        if not self.reports_only:
            return super().transform_module(tree)
        self.context = replace(self.context, wrapper=MetadataWrapper(tree, unsafe_skip_copy=True))
        self._analyse()
        self.visit_Module(tree)
        return tree

    @contextmanager
    def _handle_metadata_reference(self, module: cst.Module) -> Generator[cst.Module, None, None]:
        """LibCST's, without its copy of the tree (~14 ms per 150 lines, per step) where
        the copy changes nothing: no LibCST metadata is asked for and no node object
        appears twice in the tree (the copy makes each occurrence a node of its own)."""
        copy = bool(self.get_inherited_dependencies()) or self._facts(module).repeats_a_node
        wrapper = MetadataWrapper(module, unsafe_skip_copy=not copy)
        previous = self.context.wrapper
        with self.resolve(wrapper):
            self.context = replace(self.context, wrapper=wrapper)
            try:
                yield wrapper.module
            finally:
                self.context = replace(self.context, wrapper=previous)

    def transform_module_impl(self, tree: cst.Module) -> cst.Module:
        self._analyse()
        # Subtrees without a node this step has a method for come out unchanged.
        kinds = None if self._decorated else handled_types(type(self))
        index = self.script.index
        self._touched = None
        if kinds is not None and index is not None and index.module is tree:
            self._touched = touched_nodes(tree, index.parents, kinds)
        return super().transform_module_impl(tree)

    def _indexed(self, node: cst.CSTNode) -> bool:
        """Whether `node` belongs to the tree the step's analysis indexed."""
        index = self.script.index
        return index is not None and (node in index.parents or node is index.module)

    def _facts(self, tree: cst.Module) -> TreeFacts:
        """What this conversion knows about `tree` (whether a node repeats: found now)."""
        facts = tree_facts(self.context, tree)
        if facts.repeats_a_node is None:
            facts.repeats_a_node = repeats_a_node(tree)
        return facts

    def _analyse(self) -> None:
        """The script model of the tree in `context.wrapper`; positions reset."""
        assert self.context.wrapper is not None
        facts = self._facts(self.context.wrapper.module)
        project = self.step_context.project
        if project is not None or facts.script is None:
            # in a project, the other modules may have changed since
            facts.script = build_script_model(self.context.wrapper, project=project)
        self.script = facts.script
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
            facts = self._facts(self.context.wrapper.module)
            if facts.positions is None:
                facts.positions = self._new_positions(facts.tree)
            self._positions = facts.positions
        return self._positions[node]

    def _new_positions(self, tree: cst.Module) -> Positions:
        """Positions in `tree`: from the statement around each asked-for node when the
        pipeline passed the tree's code (a log asks for a few nodes; the whole module's
        code generation costs a pass), else from the whole module. Where the top-level
        statements start is known when the pipeline generated the tree's code; else
        CPython's parse of it tells."""
        source = self.step_context.source
        index = self.script.index
        if source is None or index is None or index.module is not tree:
            return Positions(tree)
        spans = self.step_context.module_code.statement_spans(tree)
        if spans is not None:
            return TopLevelPositions(tree, source, spans, index.parents)
        python = python_tree(source)
        if python is not None:
            return SourcePositions(tree, source, python, index.parents)
        return Positions(tree)

    def line_of(self, node: cst.CSTNode) -> int:
        return self.position_of(node).start.line

    def changed(self, node: cst.CSTNode, description: str, code: str | None = None) -> None:
        self.log.changes.append(Change(code or self.code, self.line_of(node), description))

    def skipped(
        self,
        what: str,
        reason: str,
        node: cst.CSTNode | None = None,
        *,
        wrong: bool = False,
        proof: str = "",
    ) -> None:
        """Log a rewrite not made; `wrong`: the result trains wrongly without it, unless
        the check `proof` of the proof run shows it does not."""
        line = self.line_of(node) if node is not None else None
        unbuilt = self._never_built(node) if wrong else []
        if unbuilt:
            names = ", ".join(f"`{name}`" for name in unbuilt)
            skip = Skipped(what, line, f"left as it is (the run never built {names}): {reason}")
            if skip not in self.log.skipped:
                self.log.skipped.append(skip)
            return
        self.log.skipped.append(Skipped(what, line, reason, wrong, proof))

    def _never_built(self, node: cst.CSTNode | None) -> list[str]:
        """The classes around `node` (where a refusal lies; None: the whole module) that
        the run of the script never built: classes with a `backward()` call in which the
        run, whose steps then ran elsewhere, recorded nothing (see
        `FactsResolver.ran_within`). For `node` None, every `backward()` of the module
        must lie in one. Empty where any code in question ran, or without facts of a run."""
        facts = self.module_facts()
        index = self.script.index
        if facts is None or index is None or not facts.facts.ran_steps:
            return []
        unbuilt: dict[cst.ClassDef, None] = {}
        for found in [node] if node is not None else m.findall(index.module, _BACKWARD):
            owner = self._outermost_class(found)
            if owner is None or not m.findall(owner, _BACKWARD) or facts.ran_within(owner):
                return []
            unbuilt[owner] = None
        return [owner.name.value for owner in unbuilt]

    def _outermost_class(self, node: cst.CSTNode) -> cst.ClassDef | None:
        classes = [a for a in self.ancestors(node) if isinstance(a, cst.ClassDef)]
        return classes[-1] if classes else None


def same_nodes(first: Sequence[cst.CSTNode], second: Sequence[cst.CSTNode]) -> bool:
    """Whether two sequences hold the same node objects, in the same order."""
    return len(first) == len(second) and all(a is b for a, b in zip(first, second))


# A `backward()` call: training code, whose run the facts record at its site.
_BACKWARD = m.Call(func=m.Attribute(attr=m.Name("backward")))
_SKIPPED = -1  # entered, in place of the count of edits, for a node the pass skips


def _no_field_hook(node: cst.CSTNode, attribute: str) -> None:
    """The field hook of a class without field methods."""


class StatementRewrite(Transform):
    """A transform that edits whole statements: `rebuild` maps the statements of each
    block (a module or an indented body) to their replacements, keyed by the originals."""

    def rebuild(self, originals: list, updated: list) -> list:
        raise NotImplementedError

    def leave_IndentedBlock(
        self, original_node: cst.IndentedBlock, updated_node: cst.IndentedBlock
    ) -> cst.IndentedBlock:
        body = self.rebuild(list(original_node.body), list(updated_node.body))
        if same_nodes(body, updated_node.body):
            return updated_node
        return updated_node.with_changes(body=body)
