"""Lint one source text: parse once, analyse once, run every rule in one traversal."""

from __future__ import annotations

import ast
import signal
import threading
import warnings
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

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
from autoaccel.lint.long_strings import long_concatenations, put_back, with_stand_ins
from autoaccel.lint.noqa import is_suppressed, suppressions
from autoaccel.lint.rule import Diagnostic, LintRule, Note
from autoaccel.rules import all_rules


class SourceError(Exception):
    """A file that cannot be parsed; `line`/`column` are 1-based."""

    def __init__(self, message: str, line: int, column: int) -> None:
        super().__init__(message)
        self.message = message
        self.line = line
        self.column = column


# LibCST's parser is native code: about 1,500 nested brackets, or 10,000 `and`s or
# dotted names in one expression, overflow its C stack and kill the process (a
# segfault: no traceback, no other file reported). A source nested deeper than this
# is refused before LibCST sees it; real scripts stay under 30.
MAX_NESTING = 500
TOO_DEEP = "too deeply nested for autoaccel"


def parse(source: str) -> cst.Module:
    """Parse `source`, turning a syntax error into a located `SourceError`."""
    return parse_checked(source)[0]


def parse_checked(source: str) -> tuple[cst.Module, ast.Module | None]:
    """`source` parsed by LibCST, and by CPython when it could (`None` for null bytes).
    CPython's parser reads it first: its messages and positions are the ones users know
    (LibCST's point past the error), and it measures the nesting LibCST would crash on."""
    tree = _python_syntax_tree(source)
    long_strings = long_concatenations(source, tree) if tree is not None else []
    try:
        with interruptible():
            module = cst.parse_module(with_stand_ins(source, long_strings))
    except cst.ParserSyntaxError as error:
        message = error.message.strip().splitlines()[0] if error.message else "invalid syntax"
        raise SourceError(f"SyntaxError: {message}", error.raw_line, error.raw_column + 1) from None
    return (put_back(module, source, long_strings) if long_strings else module), tree


@contextmanager
def interruptible() -> Iterator[None]:
    """Ctrl-C ends the process at once (the signal's default action), for code that
    writes nothing: Python's handler waits for LibCST's native parser (5 s for 1 MB),
    and then for the freeing of every node at exit (3 s)."""
    if threading.current_thread() is not threading.main_thread() or (
        signal.getsignal(signal.SIGINT) is not signal.default_int_handler
    ):
        yield
        return
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def _python_syntax_tree(source: str) -> ast.Module | None:
    """CPython's tree of `source`, or None when it cannot say (null bytes, which LibCST
    then reports). Raises CPython's error, or one for a nesting past `MAX_NESTING`."""
    try:
        tree = compile_quietly(source, "<lint>", ast.PyCF_ONLY_AST)
    except SyntaxError as error:
        raise SourceError(
            f"SyntaxError: {error.msg}", error.lineno or 1, error.offset or 1
        ) from None
    except (RecursionError, MemoryError):
        raise SourceError(f"{TOO_DEEP} (Python's own parser gave up)", 1, 1) from None
    except ValueError:
        return None
    stack: list[tuple[ast.AST, int]] = [(tree, 0)]
    while stack:
        node, depth = stack.pop()
        depth += _libcst_levels(node)
        if depth > MAX_NESTING:
            line, column = getattr(node, "lineno", 1), getattr(node, "col_offset", 0) + 1
            raise SourceError(f"{TOO_DEEP}: over {MAX_NESTING} nested levels", line, column)
        if depth + _most_levels_within(node) > MAX_NESTING:
            stack.extend((child, depth) for child in ast.iter_child_nodes(node))
    return tree


def _most_levels_within(node: ast.AST) -> int:
    """An upper bound of the levels below `node`: three per character of a one-line
    node (every level writes a character, or wraps one that does: a context, an `Expr`,
    `arguments`), unbounded for the others."""
    end = getattr(node, "end_col_offset", None)
    if end is None or node.lineno != node.end_lineno:  # type: ignore[attr-defined]
        return MAX_NESTING
    return 3 * (end - node.col_offset) + 3  # type: ignore[attr-defined]


def compile_quietly(source: str, filename: str, flags: int = 0) -> Any:
    """`compile(source)` without the SyntaxWarnings CPython prints about the user's
    code (`1if x else 2`, `"\\d"`): they are not autoaccel's to report."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return compile(source, filename, "exec", flags=flags, dont_inherit=True)


def python_tree(source: str) -> ast.Module | None:
    """CPython's syntax tree of `source`, without its warnings about the user's code;
    None where CPython rejects it (or cannot say: null bytes)."""
    try:
        return compile_quietly(source, "<autoaccel>", ast.PyCF_ONLY_AST)
    except (SyntaxError, ValueError):
        return None


def _libcst_levels(node: ast.AST) -> int:
    """How many levels LibCST nests `node` in: `a and b and c` is one `ast.BoolOp` but
    nested `BooleanOperation`s, and the dotted name of an import nested `Attribute`s."""
    if isinstance(node, ast.BoolOp):
        return len(node.values) - 1
    if isinstance(node, ast.alias):
        return node.name.count(".") + 1
    if isinstance(node, ast.ImportFrom):
        return (node.module or "").count(".") + 1
    return 1


def might_use_torch(source: str) -> bool:
    """Cheap prefilter: a file that never says `torch` has nothing for the rules."""
    return "torch" in source


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
        tree = _python_syntax_tree(source)
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
