"""Black's style for inserted code only: a changed statement (or `with` header) that
grew past the line length is re-formatted with black; every other byte stays as it was."""

from __future__ import annotations

import difflib

import libcst as cst

from autoaccel.analysis.positions import Positions

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
    def __init__(self, lines: set[int], positions: Positions) -> None:
        super().__init__()
        self.lines = lines
        self.positions = positions

    def _black(self, node: cst.CSTNode, code: str) -> str | None:
        """`code` (the statement `node` stands for) formatted at `node`'s indentation."""
        import black

        column = self.positions[node].start.column
        mode = black.Mode(line_length=LINE_LENGTH - column, string_normalization=False)
        try:
            return black.format_str(code, mode=mode)
        except black.InvalidInput:
            return None

    def _touched(self, node: cst.CSTNode, last_line: int | None = None) -> bool:
        position = self.positions[node]
        end = position.end.line if last_line is None else last_line
        return any(line in self.lines for line in range(position.start.line, end + 1))

    def leave_SimpleStatementLine(
        self, original_node: cst.SimpleStatementLine, updated_node: cst.SimpleStatementLine
    ) -> cst.SimpleStatementLine:
        if not self._touched(original_node):
            return updated_node
        code = cst.Module(body=[updated_node.with_changes(leading_lines=[])]).code
        formatted = self._black(original_node, code)
        statement = cst.parse_statement(formatted) if formatted else None
        if not isinstance(statement, cst.SimpleStatementLine):
            return updated_node
        return statement.with_changes(leading_lines=updated_node.leading_lines)

    def leave_With(self, original_node: cst.With, updated_node: cst.With) -> cst.With:
        """A long `with` header (e.g. an inserted autocast): only the header is
        re-formatted; the body keeps its bytes."""
        header_line = self.positions[original_node.body].start.line
        if not self._touched(original_node, last_line=header_line):
            return updated_node
        header = updated_node.with_changes(
            body=cst.IndentedBlock(body=[cst.SimpleStatementLine([cst.Pass()])]),
            leading_lines=[],
        )
        formatted = self._black(original_node, cst.Module(body=[header]).code)
        statement = cst.parse_statement(formatted) if formatted else None
        if not isinstance(statement, cst.With):
            return updated_node
        return updated_node.with_changes(
            items=statement.items,
            lpar=statement.lpar,
            rpar=statement.rpar,
            whitespace_after_with=statement.whitespace_after_with,
            whitespace_before_colon=statement.whitespace_before_colon,
        )


def format_inserted_code(before: str, after: str) -> str:
    """`after` with each changed statement longer than the line length black-formatted."""
    lines = _changed_long_lines(before, after)
    if not lines:
        return after
    module = cst.parse_module(after)
    return module.visit(_FormatStatements(lines, Positions(module))).code
