"""Implicitly joined strings of many parts (`("a"\\n"b"\\n ...)`), parsed without the
depth they would cost.

LibCST nests a concatenation of n strings n levels deep: over 3,000 parts its parser
refuses it (a "syntax error" in valid Python), and some hundreds already exhaust
Python's recursion in any visitor. Such a string is handed to LibCST as a stand-in
of the same layout (one triple-quoted string, every line break kept, so every other
position stays right) and then put back in the tree as a `LongConcatenatedString`:
one node that writes the original text."""

from __future__ import annotations

import ast
import io
import tokenize
from dataclasses import dataclass
from collections.abc import Sequence

import libcst as cst

from autoaccel.cst_internals import CodegenState, visit_sequence
from autoaccel.fileio import line_starts

# Parts from which a concatenation is parsed as one node; a rule never looks inside.
MAX_PARTS = 100
_STRING_TOKENS = {tokenize.STRING, getattr(tokenize, "FSTRING_START", tokenize.STRING)}


@dataclass(frozen=True)
class LongConcatenatedString(cst.BaseString):
    """A concatenation of more than `MAX_PARTS` strings, kept as its source text."""

    value: str
    lpar: Sequence[cst.LeftParen] = ()
    rpar: Sequence[cst.RightParen] = ()

    @property
    def evaluated_value(self) -> str | bytes | None:
        """The joined string, as `ConcatenatedString.evaluated_value` gives it (None
        when a part is an f-string)."""
        try:
            return ast.literal_eval(f"({self.value}\n)")
        except ValueError:
            return None

    def _visit_and_replace_children(self, visitor: cst.CSTVisitorT) -> LongConcatenatedString:
        return LongConcatenatedString(
            value=self.value,
            lpar=visit_sequence(self, "lpar", self.lpar, visitor),
            rpar=visit_sequence(self, "rpar", self.rpar, visitor),
        )

    def _codegen_impl(self, state: CodegenState) -> None:
        with self._parenthesize(state):
            state.add_token(self.value)


@dataclass(frozen=True)
class Span:
    """Where a long concatenation sits in the source (character offsets)."""

    start: int
    end: int


def long_concatenations(source: str, tree: ast.Module) -> list[Span]:
    """The concatenations of more than `MAX_PARTS` strings in `source` (parsed by
    CPython into `tree`), in source order; f-strings inside an f-string are not
    looked at."""
    starts: list[int] = []
    spans = []
    stack: list[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        if not isinstance(node, (ast.Constant, ast.JoinedStr)):
            stack.extend(ast.iter_child_nodes(node))
        elif _may_be_long(node):
            starts = starts or line_starts(source)
            span = Span(
                _offset(source, starts, node.lineno, node.col_offset),
                _offset(source, starts, node.end_lineno, node.end_col_offset),  # type: ignore[arg-type]
            )
            if _parts(source[span.start : span.end]) > MAX_PARTS:
                spans.append(span)
    return sorted(spans, key=lambda span: span.start)


def _may_be_long(node: ast.Constant | ast.JoinedStr) -> bool:
    """Whether `node` is a string written over enough characters for `MAX_PARTS`
    parts (two quotes each)."""
    if isinstance(node, ast.Constant) and not isinstance(node.value, (str, bytes)):
        return False
    return node.end_lineno != node.lineno or node.end_col_offset - node.col_offset > 2 * MAX_PARTS  # type: ignore[operator]


def _offset(source: str, starts: list[int], line: int, utf8_column: int) -> int:
    """The character offset of CPython's (line, UTF-8 byte column)."""
    start = starts[line - 1]
    text = source[start : start + utf8_column]
    if not text.isascii():
        text = source[start:].encode()[:utf8_column].decode()
    return start + len(text)


def _parts(text: str) -> int:
    """How many string literals `text`, one string expression, is written with."""
    if text.count('"') + text.count("'") <= 2 * MAX_PARTS:
        return 1
    parts = depth = 0
    for token in tokenize.generate_tokens(io.StringIO(f"({text}\n)").readline):
        if token.type in _STRING_TOKENS and depth == 0:
            parts += 1
        if token.type == getattr(tokenize, "FSTRING_START", None):
            depth += 1
        elif token.type == getattr(tokenize, "FSTRING_END", None):
            depth -= 1
    return parts


def with_stand_ins(source: str, spans: list[Span]) -> str:
    """`source` with each span replaced by a triple-quoted string of the same length
    and line breaks."""
    pieces, done = [], 0
    for span in spans:
        inner = "".join(c if c in "\r\n" else " " for c in source[span.start + 3 : span.end - 3])
        pieces += [source[done : span.start], "'''", inner, "'''"]
        done = span.end
    return "".join([*pieces, source[done:]])


class _PutBack(cst.CSTTransformer):
    """Replaces the stand-ins, met in source order, by the original strings."""

    def __init__(self, originals: list[str]) -> None:
        super().__init__()
        self._originals = iter(originals)
        self._stand_ins = iter(with_stand_ins(text, [Span(0, len(text))]) for text in originals)
        self._next = next(self._stand_ins, None)

    def leave_SimpleString(
        self, original_node: cst.SimpleString, updated_node: cst.SimpleString
    ) -> cst.BaseExpression:
        if updated_node.value != self._next:
            return updated_node
        self._next = next(self._stand_ins, None)
        return LongConcatenatedString(next(self._originals), updated_node.lpar, updated_node.rpar)


def put_back(module: cst.Module, source: str, spans: list[Span]) -> cst.Module:
    """`module`, parsed from `with_stand_ins(source, spans)`, with the original strings."""
    return module.visit(_PutBack([source[span.start : span.end] for span in spans]))
