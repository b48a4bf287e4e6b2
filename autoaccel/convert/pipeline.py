"""Compose the transforms of a target and check the result before anyone writes it.

Black's habit, adapted to a rewriter: the output must parse and `compile()`, and a
second conversion of the output must change nothing (every step idempotent).
"""

from __future__ import annotations

import difflib
import gc
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

import libcst as cst
from libcst.codemod import CodemodContext

from autoaccel.convert.log import MULTI_PROCESS, ConversionLog, ConvertOptions, Target
from autoaccel.convert.transform import (
    Analyses,
    InsertedNames,
    StepContext,
    Transform,
    TreeFacts,
    step_context,
)
from autoaccel.analysis.index import repeats_a_node, repeats_a_node_since
from autoaccel.diff import original_line
from autoaccel.formatting import format_inserted_statements
from autoaccel.module_code import ModuleCode
from autoaccel.source import compile_quietly, parse

if TYPE_CHECKING:
    from autoaccel.analysis.script_model import ProjectContext
    from autoaccel.convert.transforms.rule_fixes import RuleFixes
    from autoaccel.facts.resolve import ConversionFacts


class ConversionError(Exception):
    """The conversion cannot be trusted; nothing may be written. `details` (a diff)
    is too long for the one-line message."""

    def __init__(self, message: str, details: str = "") -> None:
        super().__init__(message)
        self.details = details
        self.path: Path | None = None  # the file at fault, in a conversion of several


@dataclass
class Conversion:
    original: str
    converted: str
    log: ConversionLog = field(default_factory=ConversionLog)

    @property
    def changed(self) -> bool:
        return self.converted != self.original


def transforms_for(options: ConvertOptions) -> list[type[Transform] | type[RuleFixes]]:
    """The steps of a target, in order: the single-process speed-ups first, then
    the multi-GPU scaffolding of `--to dp` / `ddp` / `fsdp`, then the rule fixes that
    names imported by those steps reveal."""
    from autoaccel.convert.transforms import rule_fixes
    from autoaccel.convert.transforms.add_autocast import AddAutocast
    from autoaccel.convert.transforms.call_modules import CallModules
    from autoaccel.convert.transforms.compile_model import CompileModel
    from autoaccel.convert.transforms.channels_last import ChannelsLast
    from autoaccel.convert.transforms.replace_apex_amp import ReplaceApexAmp

    steps: list[type[Transform] | type[RuleFixes]] = [
        ReplaceApexAmp,  # first: the rule fixes then see plain torch code
        # before autocast and the target's steps, which find the model by its calls
        CallModules,
        rule_fixes.SingleProcessFixes,
        AddAutocast,
        CompileModel,
        ChannelsLast,
    ]
    if options.target == "dp":
        from autoaccel.convert.transforms.data_parallel import DP_STEPS

        steps += DP_STEPS
    elif options.target == "ddp":
        from autoaccel.convert.transforms.distributed import DDP_STEPS

        steps += DDP_STEPS
    elif options.target == "fsdp":
        from autoaccel.convert.transforms.fully_sharded import FSDP_STEPS

        steps += FSDP_STEPS
    else:
        return [*steps, rule_fixes.FixesThroughNewImports]
    from autoaccel.convert.transforms.inserted_names import ChooseNames, RestoreNames

    # the target's steps write their own names; the script's keep out of their way
    steps.insert(steps.index(ChannelsLast) + 1, ChooseNames)
    return [*steps, rule_fixes.FixesThroughNewImports, RestoreNames]


@dataclass
class ModuleState:
    """A module being converted: its tree (parsed, or rewritten by the steps), the code
    of that tree, and the (before, after) texts of every step that changed it (to report
    lines of the original)."""

    tree: cst.Module
    text: str
    history: list[tuple[str, str]] = field(default_factory=list)
    analyses: Analyses = field(default_factory=dict)  # a tree passed on unchanged is analysed once
    module_code: ModuleCode = field(default_factory=ModuleCode)
    inserted_names: InsertedNames = field(default_factory=InsertedNames)

    def __post_init__(self) -> None:
        # A parsed tree holds each node object once: no step need walk it to find out.
        self.analyses.setdefault(id(self.tree), TreeFacts(self.tree, repeats_a_node=False))

    @classmethod
    def of(cls, source: str) -> ModuleState:
        return cls(parse(source), source)

    def context(
        self,
        options: ConvertOptions,
        log: ConversionLog,
        path: str | None,
        facts: ConversionFacts | None = None,
        project: ProjectContext | None = None,
        entry: bool = True,
    ) -> CodemodContext:
        """The context of the next step over this module (see `StepContext`)."""
        shared = StepContext(
            options,
            log,
            self.text,
            self.analyses,
            self.module_code,
            self.inserted_names,
            project,
            entry,
            facts,
        )
        return shared.codemod_context(path)


def apply_step(
    step: type[Transform] | type[RuleFixes], state: ModuleState, context: CodemodContext
) -> None:
    """Run one step over `state` (code generated once, inserted code formatted)."""
    shared = step_context(context)
    log = shared.log
    logged = (len(log.changes), len(log.skipped))
    transformed = step(context).transform_module(state.tree)
    _in_the_users_terms(log, logged, state.history, shared.options.target)
    if transformed is state.tree:
        return  # the step had nothing to do
    if getattr(step, "renames_names", False):
        # names only: the lines stay where they are, none to format
        state.tree, state.text = transformed, state.module_code(transformed)
        state.analyses.clear()
        state.analyses[id(transformed)] = TreeFacts(transformed, repeats_a_node=False)
        return
    generated = state.module_code(transformed)
    if generated == state.text:
        return  # the same code: the next step gets the tree analysed already
    if _repeats_a_node(transformed, state):
        transformed = cst.parse_module(generated)  # each occurrence a node of its own
    state.tree, after = format_inserted_statements(
        state.text, transformed, generated, state.module_code
    )
    # What is known of trees no step will get again goes (the step may have analysed
    # the tree it hands on: the rule fixes do).
    known = state.analyses.get(id(state.tree))
    state.analyses.clear()
    facts = known if known is not None and known.tree is state.tree else TreeFacts(state.tree)
    facts.repeats_a_node = False  # formatting only puts freshly parsed statements in
    state.analyses[id(state.tree)] = facts
    if after != state.text:
        state.history.append((state.text, after))
    state.text = after


def _repeats_a_node(transformed: cst.Module, state: ModuleState) -> bool:
    """Whether a node object sits twice in `transformed`, a step's rewrite of
    `state.tree`: found from the nodes the step made where `state.tree` was indexed."""
    facts = state.analyses.get(id(state.tree))
    index = facts.script.index if facts is not None and facts.script is not None else None
    if index is None or index.module is not state.tree:
        return repeats_a_node(transformed)
    return repeats_a_node_since(transformed, index)


def _run(
    source: str,
    options: ConvertOptions,
    log: ConversionLog,
    path: str | None,
    tree: cst.Module | None = None,
    facts: ConversionFacts | None = None,
    history: list[tuple[str, str]] | None = None,
) -> str:
    """The code of `source` (parsed as `tree` when given) after every step of the target;
    `facts` (of a run of the script) reach the steps through their context. `history`:
    the changes that made `source` from the text that ran (extended in place)."""
    state = ModuleState.of(source) if tree is None else ModuleState(tree, source)
    if history is not None:
        state.history = history
    if facts is not None:
        facts.history = state.history  # the steps map their tree's lines back through it
    for step in transforms_for(options):
        if step.enabled(options):
            apply_step(step, state, state.context(options, log, path, facts))
    return state.text


_COLLECTIONS_LOCK = threading.Lock()
_conversions_under_way = 0
_saved_thresholds: tuple[int, ...] = ()


@contextmanager
def fewer_collections() -> Iterator[None]:
    """Python's cyclic garbage collector run ~14x less often for the duration. A
    conversion allocates millions of nodes, and the trees it drops sit in reference
    cycles of their analyses: at the default threshold (700 allocations) collections
    took ~10% of a conversion's time, for 6% less peak memory (2,000 lines). With
    conversions in several threads, the last one to end restores the thresholds."""
    global _conversions_under_way, _saved_thresholds
    with _COLLECTIONS_LOCK:
        if not _conversions_under_way:
            _saved_thresholds = gc.get_threshold()
            gc.set_threshold(10_000, *_saved_thresholds[1:])
        _conversions_under_way += 1
    try:
        yield
    finally:
        with _COLLECTIONS_LOCK:
            _conversions_under_way -= 1
            if not _conversions_under_way:
                gc.set_threshold(*_saved_thresholds)


def _in_the_users_terms(
    log: ConversionLog, start: tuple[int, int], history: list[tuple[str, str]], target: Target
) -> None:
    """Steps log lines of the text they received, and `--to fsdp` runs steps of `--to
    ddp`, which label their changes "ddp": report lines of the original, and the target
    the user asked for. `start`: how many changes and skipped items were logged before
    this step."""
    for index in range(start[0], len(log.changes)):
        change = log.changes[index]
        code = target if change.code in MULTI_PROCESS else change.code
        log.changes[index] = replace(change, code=code, line=original_line(history, change.line))
    for index in range(start[1], len(log.skipped)):
        skipped = log.skipped[index]
        if skipped.line is not None:
            log.skipped[index] = replace(skipped, line=original_line(history, skipped.line))


def convert_source(
    source: str,
    options: ConvertOptions,
    path: str = "<string>",
    facts: ConversionFacts | None = None,
) -> Conversion:
    """Convert the script `source` (`path` names the result, for its launch commands),
    with the `facts` of a run of it where there was one (the second conversion, of the
    result, gets them too: its lines map back to the run's through the first one's
    changes, so a step the facts decided decides the same).
    Raises `SourceError` when it does not parse and `ConversionError` when the result
    fails a safety check."""
    log = ConversionLog()
    script = None if path.startswith("<") else path
    history: list[tuple[str, str]] = []
    with fewer_collections():
        converted = _run(source, options, log, script, facts=facts, history=history)
        if converted != source:
            tree = check_compiles(converted, path)
            again = _run(converted, options, ConversionLog(), script, tree, facts, list(history))
            check_stable(converted, again)
    return Conversion(source, converted, log)


def check_result(converted: str, path: str, rewrite_again: Callable[[str], str]) -> None:
    """Black's checks before anything is written: `converted` parses and compiles, and
    the same rewrite run over it changes nothing. Raises `ConversionError` otherwise."""
    check_compiles(converted, path)
    check_stable(converted, rewrite_again(converted))


def check_compiles(converted: str, path: str) -> cst.Module:
    """The tree of `converted`, which must parse and compile (`ConversionError` if not)."""
    try:
        tree = parse(converted)
        compile_quietly(converted, path)
    except (SyntaxError, Exception) as error:  # noqa: BLE001 - any failure blocks the write
        message = f"internal error: the converted code does not compile: {error}"
        raise ConversionError(message) from error
    return tree


def check_stable(converted: str, again: str) -> None:
    """`again` (the rewrite run over `converted`) must be `converted` (`ConversionError`)."""
    if again != converted:
        diff = "".join(
            difflib.unified_diff(
                converted.splitlines(True), again.splitlines(True), "first", "second"
            )
        )
        raise ConversionError(
            "internal error: converting the output again changes it (a step is not"
            " idempotent); nothing was written",
            details=diff,
        )
