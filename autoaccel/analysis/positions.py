"""Where each node sits in the source: the ranges LibCST's `PositionProvider` gives,
for a fraction of its cost.

`PositionProvider` updates a line and column with a regular expression for every token
it writes, and LibCST resolves it after a full (empty) visitor pass. Here code
generation only notes token indices, and a finding's line and column are looked up
from them when asked (a bisect over the line starts). When the module was parsed from a
source whose syntax tree CPython gave too (lint), only the statement around an asked-for
node is generated: CPython's tree says on which line that statement starts."""

from __future__ import annotations

import ast
import re
from bisect import bisect_right
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from itertools import accumulate
from typing import NamedTuple

import libcst as cst
from libcst.metadata import CodePosition, CodeRange

from autoaccel.analysis.statements import statements
from autoaccel.cst_internals import CodegenState, generate
from autoaccel.fileio import line_starts
from autoaccel.module_code import Spans

INDENT = re.compile(r"[ \t\f]*")

Span = tuple[int, int]  # token indices: the node's first token, one past its last


@dataclass
class _SpanRecorder(CodegenState):
    """Code generation that notes each node's token span, with LibCST's rules: the
    syntactic span a node declares wins over the span of everything it writes."""

    spans: dict[cst.CSTNode, Span] = field(default_factory=dict)
    _starts: list[int] = field(default_factory=list)

    def before_codegen(self, node: cst.CSTNode) -> None:
        self._starts.append(len(self.tokens))

    def after_codegen(self, node: cst.CSTNode) -> None:
        self.spans.setdefault(node, (self._starts.pop(), len(self.tokens)))

    def pop_trailing_newline(self) -> None:
        """Keep it: `PositionProvider` counts it in the module's end as well."""

    @contextmanager
    def record_syntactic_position(
        self,
        node: cst.CSTNode,
        *,
        start_node: cst.CSTNode | None = None,
        end_node: cst.CSTNode | None = None,
    ) -> Iterator[None]:
        start = len(self.tokens)
        yield
        end = len(self.tokens)
        if start_node is not None:
            start = self.spans[start_node][0]
        if end_node is not None:
            end = self.spans[end_node][1]
        self.spans[node] = (start, end)


@dataclass
class _Generated:
    """The spans of one generated node (the module, or a statement) and the character
    offset of each of its tokens in the module's text."""

    spans: dict[cst.CSTNode, Span]
    offsets: list[int]

    @classmethod
    def of(cls, node: cst.CSTNode, state: _SpanRecorder, start: int = 0) -> _Generated:
        generate(node, state)
        return cls(state.spans, list(accumulate(map(len, state.tokens), initial=start)))


class Positions(Mapping[cst.CSTNode, CodeRange]):
    """Node → `CodeRange` (1-based lines, 0-based columns), computed on first use."""

    def __init__(self, module: cst.Module) -> None:
        self._module = module
        self._whole: _Generated | None = None
        self._line_starts: list[int] = []

    def _generated(self, node: cst.CSTNode) -> _Generated:
        """The code generation `node` was written in."""
        return self._whole_module()

    def _whole_module(self) -> _Generated:
        if self._whole is None:
            module = self._module
            state = _SpanRecorder(module.default_indent, module.default_newline)
            self._whole = _Generated.of(module, state)
            self._line_starts = line_starts("".join(state.tokens))
        return self._whole

    def _position(self, offset: int) -> CodePosition:
        line = bisect_right(self._line_starts, offset)
        return CodePosition(line, offset - self._line_starts[line - 1])

    def __getitem__(self, node: cst.CSTNode) -> CodeRange:
        generated = self._generated(node)
        start, end = generated.spans[node]
        offsets = generated.offsets
        return CodeRange(self._position(offsets[start]), self._position(offsets[end]))

    def __iter__(self) -> Iterator[cst.CSTNode]:
        return iter(self._whole_module().spans)

    def __len__(self) -> int:
        return len(self._whole_module().spans)


class SourcePositions(Positions):
    """Positions in the module parsed from `source`, which CPython parsed into `tree`:
    a node's statement is generated on its own, from the line CPython puts it on, and
    checked against the source (the whole module is generated when that fails)."""

    def __init__(
        self,
        module: cst.Module,
        source: str,
        tree: ast.Module,
        parents: Mapping[cst.CSTNode, cst.CSTNode],
    ) -> None:
        super().__init__(module)
        # The text generated from `module`: a last newline is written even when the
        # source has none, as `PositionProvider` counts it.
        self._text = source if module.has_trailing_newline else source + module.default_newline
        self._tree = tree
        self._parents = parents
        self._line_starts = line_starts(self._text)
        self._lines: dict[cst.BaseStatement, StatementLines] | None = None
        self._statements: dict[cst.BaseStatement, _Generated | None] = {}

    def _generated(self, node: cst.CSTNode) -> _Generated:
        if self._whole is None:
            statement = self._statement(node)
            if statement is not None:
                if statement not in self._statements:
                    self._statements[statement] = self._generate(statement)
                generated = self._statements[statement]
                if generated is not None and node in generated.spans:
                    return generated
        return self._whole_module()

    def _statement(self, node: cst.CSTNode) -> cst.BaseStatement | None:
        """The statement `node` is written in (an `elif` is written by its `if`)."""
        parents = self._parents
        while node is not None and not (
            isinstance(node, cst.BaseStatement)
            and not (isinstance(node, cst.If) and isinstance(parents.get(node), cst.If))
        ):
            node = parents.get(node)
        return node

    def _generate(self, statement: cst.BaseStatement) -> _Generated | None:
        """`statement` generated from the start of its first line (its leading blank and
        comment lines included), or None when that does not reproduce the source."""
        if self._lines is None:
            self._lines = statement_lines(self._module, self._tree)
        first, own, _ = self._lines.get(statement, _NOWHERE)
        if not 1 <= first <= own <= len(self._line_starts):
            return None
        start = self._line_starts[first - 1]
        indent = INDENT.match(self._text, self._line_starts[own - 1]).group()  # type: ignore[union-attr]
        module = self._module
        state = _SpanRecorder(module.default_indent, module.default_newline, indent_tokens=[indent])
        generated = _Generated.of(statement, state, start)
        if not self._text.startswith("".join(state.tokens), start):
            return None
        return generated


class TopLevelPositions(Positions):
    """Positions in a module whose code `text` is known with the span of each top-level
    statement in it (`spans`): the top-level statement around an asked-for node is
    generated on its own (`parents`: the module index's)."""

    def __init__(
        self,
        module: cst.Module,
        text: str,
        spans: Spans,
        parents: Mapping[cst.CSTNode, cst.CSTNode],
    ) -> None:
        super().__init__(module)
        self._line_starts = line_starts(text)
        self._spans = spans
        self._parents = parents
        self._statements: dict[cst.CSTNode, _Generated] = {}

    def _generated(self, node: cst.CSTNode) -> _Generated:
        top, parent = node, self._parents.get(node)
        while parent is not None and parent is not self._module:
            top, parent = parent, self._parents.get(parent)
        span = self._spans.get(top) if parent is not None else None  # type: ignore[call-overload]
        if self._whole is not None or span is None:
            return self._whole_module()
        generated = self._statements.get(top)
        if generated is None:
            module = self._module
            state = _SpanRecorder(module.default_indent, module.default_newline)
            generated = self._statements[top] = _Generated.of(top, state, span[0])
        return generated if node in generated.spans else self._whole_module()


class StatementLines(NamedTuple):
    """The lines of a statement in its module's text (1-based)."""

    first: int  # where its code generation starts: its leading blank and comment lines
    own: int  # its own first token (the first decorator's, for a decorated definition)
    last: int  # its last token


_NOWHERE = StatementLines(0, 0, 0)
_DEFINITIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


def statement_lines(
    module: cst.Module, tree: ast.Module
) -> dict[cst.BaseStatement, StatementLines]:
    """The lines of each statement of `module`, whose text CPython parsed into `tree`:
    LibCST's statements matched with CPython's in source order (a one-line suite's small
    statements are not listed); empty when they do not match one to one."""
    found: dict[cst.BaseStatement, StatementLines] = {}
    python = _python_statements(tree)
    for node in statements(module.body):
        if isinstance(node, (cst.SimpleStatementSuite, cst.IndentedBlock)):
            for _ in node.body or (None,):  # an empty block's `pass`
                next(python, None)
            continue
        first = last = next(python, None)
        if first is None:
            return {}
        lines = len(node.leading_lines)
        if isinstance(node, cst.SimpleStatementLine):
            for _ in node.body[1:]:
                last = next(python, last)
        elif isinstance(node, (cst.FunctionDef, cst.ClassDef)) and node.decorators:
            if not isinstance(first, _DEFINITIONS):
                return {}
            first = first.decorator_list[0]
            lines += len(node.decorators[0].leading_lines)
        found[node] = StatementLines(
            first.lineno - lines, first.lineno, last.end_lineno or last.lineno
        )
    return found if next(python, None) is None else {}


def _python_statements(node: ast.AST) -> Iterator[ast.stmt]:
    """CPython's statements in `node`, in source order."""
    for name in node._fields:
        value = getattr(node, name)
        for child in value if isinstance(value, list) else (value,):
            if isinstance(child, ast.stmt):
                yield child
                yield from _python_statements(child)
            elif isinstance(child, (ast.excepthandler, ast.match_case)):
                yield from _python_statements(child)
