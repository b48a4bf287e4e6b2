"""A module's code without generating the top-level statements it shares with the
last module generated: the steps of a conversion hand on most statements as they were
(the same node objects), and LibCST's code generation of a whole module is a pass over
every node (~0.08 s at 2,000 lines, after each step that changes the tree)."""

from __future__ import annotations

import libcst as cst

from autoaccel.cst_internals import CodegenState, generate

Spans = dict[cst.BaseStatement, tuple[int, int]]  # top-level statement -> (start, end) in the code


class ModuleCode:
    """`Module.code`, keeping the text of each top-level statement of the last module it
    generated. A top-level statement's text depends on the node and the module's
    indentation and newline only."""

    def __init__(self) -> None:
        self._layout: tuple[str, str] | None = None
        self._texts: dict[cst.BaseStatement, str] = {}

    def __call__(self, module: cst.Module) -> str:
        if not module.has_trailing_newline:
            return module.code  # LibCST drops the last token there: a rare file
        layout = (module.default_indent, module.default_newline)
        known = self._texts if layout == self._layout else {}
        state = CodegenState(*layout)
        for line in module.header:
            generate(line, state)
        texts: dict[cst.BaseStatement, str] = {}
        for statement in module.body:
            text = known.get(statement)
            if text is None:
                start = len(state.tokens)
                generate(statement, state)
                text = "".join(state.tokens[start:])
            else:
                state.tokens.append(text)
            texts[statement] = text
        for line in module.footer:
            generate(line, state)
        self._layout, self._texts = layout, texts
        return "".join(state.tokens) or module.default_newline  # an empty module: a newline

    def statement_spans(self, module: cst.Module) -> Spans | None:
        """Where each top-level statement of `module` starts and ends in its code, when
        each was in the last module generated here (None otherwise)."""
        layout = (module.default_indent, module.default_newline)
        if not module.has_trailing_newline or layout != self._layout:
            return None
        state = CodegenState(*layout)
        for line in module.header:
            generate(line, state)
        start = sum(map(len, state.tokens))
        spans: Spans = {}
        for statement in module.body:
            text = self._texts.get(statement)
            if text is None:
                return None
            spans[statement] = (start, start + len(text))
            start += len(text)
        return spans
