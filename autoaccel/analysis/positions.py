"""Where each node sits in the source: the ranges LibCST's `PositionProvider` gives,
for a fraction of its cost.

`PositionProvider` updates a line and column with a regular expression for every token
it writes, and LibCST resolves it after a full (empty) visitor pass. Here code
generation only notes token indices, and a finding's line and column are looked up
from them when asked (a bisect over the line starts)."""

from __future__ import annotations

import re
from bisect import bisect_right
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from itertools import accumulate

import libcst as cst
from libcst._nodes.internal import CodegenState
from libcst.metadata import CodePosition, CodeRange

NEWLINE = re.compile(r"\r\n?|\n")

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


class Positions(Mapping[cst.CSTNode, CodeRange]):
    """Node → `CodeRange` (1-based lines, 0-based columns), computed on first use."""

    def __init__(self, module: cst.Module) -> None:
        self._module = module
        self._spans: dict[cst.CSTNode, Span] | None = None
        self._offsets: list[int] = []  # token index → character offset
        self._line_starts: list[int] = []

    def _computed(self) -> dict[cst.CSTNode, Span]:
        if self._spans is None:
            module = self._module
            state = _SpanRecorder(module.default_indent, module.default_newline)
            module._codegen(state)
            text = "".join(state.tokens)
            self._offsets = [0, *accumulate(map(len, state.tokens))]
            self._line_starts = [0, *(match.end() for match in NEWLINE.finditer(text))]
            self._spans = state.spans
        return self._spans

    def _position(self, token: int) -> CodePosition:
        offset = self._offsets[token]
        line = bisect_right(self._line_starts, offset)
        return CodePosition(line, offset - self._line_starts[line - 1])

    def __getitem__(self, node: cst.CSTNode) -> CodeRange:
        start, end = self._computed()[node]
        return CodeRange(self._position(start), self._position(end))

    def __iter__(self) -> Iterator[cst.CSTNode]:
        return iter(self._computed())

    def __len__(self) -> int:
        return len(self._computed())
