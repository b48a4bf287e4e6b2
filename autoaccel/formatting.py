"""Black's style for inserted code only: a changed statement that grew past the line
length is re-formatted with black; every other byte of the file stays as it was."""

from __future__ import annotations

import difflib

import libcst as cst
from libcst.metadata import MetadataWrapper, PositionProvider

LINE_LENGTH = 88


def _changed_long_lines(before: str, after: str) -> set[int]:
    old, new = before.splitlines(), after.splitlines()
    matcher = difflib.SequenceMatcher(a=old, b=new, autojunk=False)
    changed: set[int] = set()
    for tag, _, _, j1, j2 in matcher.get_opcodes():
        if tag in ("replace", "insert"):
            changed.update(
                line + 1 for line in range(j1, j2) if len(new[line]) > LINE_LENGTH
            )
    return changed


class _FormatStatements(cst.CSTTransformer):
    METADATA_DEPENDENCIES = (PositionProvider,)

    def __init__(self, lines: set[int]) -> None:
        super().__init__()
        self.lines = lines

    def leave_SimpleStatementLine(
        self, original_node: cst.SimpleStatementLine, updated_node: cst.SimpleStatementLine
    ) -> cst.SimpleStatementLine:
        position = self.get_metadata(PositionProvider, original_node)
        span = range(position.start.line, position.end.line + 1)
        if not any(line in self.lines for line in span):
            return updated_node
        import black

        mode = black.Mode(
            line_length=LINE_LENGTH - position.start.column, string_normalization=False
        )
        code = cst.Module(body=[updated_node.with_changes(leading_lines=[])]).code
        try:
            formatted = black.format_str(code, mode=mode)
        except black.InvalidInput:
            return updated_node
        statement = cst.parse_statement(formatted)
        if not isinstance(statement, cst.SimpleStatementLine):
            return updated_node
        return statement.with_changes(leading_lines=updated_node.leading_lines)


def format_inserted_code(before: str, after: str) -> str:
    """`after` with each changed statement longer than the line length black-formatted."""
    lines = _changed_long_lines(before, after)
    if not lines:
        return after
    wrapper = MetadataWrapper(cst.parse_module(after), unsafe_skip_copy=True)
    return wrapper.visit(_FormatStatements(lines)).code
