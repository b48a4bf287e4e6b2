"""Black's style for inserted code only: a changed statement (or `with`/`for` header)
that grew past the line length is re-formatted with black; every other byte stays as it was,
and inserted lines end with the file's newline."""

from __future__ import annotations

import re
from bisect import bisect_left, bisect_right
from typing import TypeVar

import libcst as cst

from autoaccel.analysis.positions import INDENT, StatementLines, statement_lines
from autoaccel.analysis.statements import HOLDS_STATEMENTS
from autoaccel.diff import LineMatcher, line_opcodes
from autoaccel.fileio import line_starts, source_lines
from autoaccel.module_code import ModuleCode, Spans
from autoaccel.source import python_tree

LINE_LENGTH = 88

# The fields of a compound statement's header (everything but its body and the lines
# around it), for the headers that a rewrite lengthens: an inserted autocast, a sharded
# argument of the loop's batch maker.
Header = cst.With | cst.For
HeaderT = TypeVar("HeaderT", cst.With, cst.For)
_HEADER_FIELDS: dict[type[Header], tuple[str, ...]] = {
    cst.With: ("items", "lpar", "rpar", "whitespace_after_with", "whitespace_before_colon"),
    cst.For: (
        "target",
        "iter",
        "whitespace_after_for",
        "whitespace_before_in",
        "whitespace_after_in",
        "whitespace_before_colon",
    ),
}


def _changed_long_lines(before: str, after: str) -> set[int]:
    new = source_lines(after)
    changed: set[int] = set()
    for tag, _, _, j1, j2 in line_opcodes(before, after):
        if tag in ("replace", "insert"):
            changed.update(line + 1 for line in range(j1, j2) if len(new[line]) > LINE_LENGTH)
    return changed


class _FormatStatements(cst.CSTTransformer):
    """Replaces the `statements` and the `with`/`for` headers in `headers` with black's
    formatting, at the column each starts on (the values); visits only the compound
    statements `around` them, so every other statement stays the node it was."""

    def __init__(
        self,
        statements: dict[cst.BaseStatement, int],
        headers: dict[Header, int],
        around: set[cst.BaseStatement],
    ) -> None:
        super().__init__()
        self.statements = statements
        self.headers = headers
        self.around = around

    def on_visit(self, node: cst.CSTNode) -> bool:
        if isinstance(node, cst.BaseStatement):
            return node in self.around
        return isinstance(node, HOLDS_STATEMENTS)  # a block or clause of a visited statement

    def leave_SimpleStatementLine(
        self, original_node: cst.SimpleStatementLine, updated_node: cst.SimpleStatementLine
    ) -> cst.SimpleStatementLine:
        column = self.statements.get(original_node)
        if column is None:
            return updated_node
        code = cst.Module(body=[updated_node.with_changes(leading_lines=[])]).code
        statement = _black_statement(code, column)
        if not isinstance(statement, cst.SimpleStatementLine):
            return updated_node
        return statement.with_changes(leading_lines=updated_node.leading_lines)

    def leave_With(self, original_node: cst.With, updated_node: cst.With) -> cst.With:
        return self._format_header(original_node, updated_node)

    def leave_For(self, original_node: cst.For, updated_node: cst.For) -> cst.For:
        return self._format_header(original_node, updated_node)

    def _format_header(self, original_node: HeaderT, updated_node: HeaderT) -> HeaderT:
        """A long header: only the header is re-formatted; the body (and an `else:`)
        keeps its bytes."""
        column = self.headers.get(original_node)
        if column is None:
            return updated_node
        header = updated_node.with_changes(
            body=cst.IndentedBlock(body=[cst.SimpleStatementLine([cst.Pass()])]),
            leading_lines=[],
            **({"orelse": None} if isinstance(updated_node, cst.For) else {}),
        )
        statement = _black_statement(cst.Module(body=[header]).code, column)
        if type(statement) is not type(updated_node):
            return updated_node
        fields = _HEADER_FIELDS[type(updated_node)]
        return updated_node.with_changes(**{f: getattr(statement, f) for f in fields})


def _black_statement(code: str, column: int) -> cst.BaseStatement | None:
    """The statement `code`, formatted by black to fit at `column` (None if black
    cannot, or splits it: `a = f(x); b = g(x)` becomes two lines)."""
    import black

    mode = black.Mode(line_length=LINE_LENGTH - column, string_normalization=False)
    try:
        formatted = cst.parse_module(black.format_str(code, mode=mode))
    except black.InvalidInput:
        return None
    return formatted.body[0] if len(formatted.body) == 1 else None


def format_inserted_code(before: str, after: str) -> str:
    """`after` (LibCST's code for a rewrite of `before`) with each changed statement
    longer than the line length black-formatted, and its untouched lines as in `before`."""
    lines = _changed_long_lines(before, after)
    if lines:
        after = _format_statements(cst.parse_module(after), after, lines, None).code
    return _keep_untouched_bytes(before, after)


def format_inserted_statements(
    before: str, tree: cst.Module, after: str, module_code: ModuleCode
) -> tuple[cst.Module, str]:
    """`format_inserted_code` for a rewritten `tree` whose code is `after` (generated
    by `module_code`) and which holds each node object once: the tree of the result
    (`tree` re-formatted, without a new parse unless bytes outside the rewrite are put
    back) and its code."""
    lines = _changed_long_lines(before, after)
    if lines:
        tree = _format_statements(tree, after, lines, module_code.statement_spans(tree))
        after = module_code(tree)
    kept = _keep_untouched_bytes(before, after)
    return (tree if kept == after else cst.parse_module(kept)), kept


def _format_statements(
    module: cst.Module, code: str, lines: set[int], spans: Spans | None
) -> cst.Module:
    """`module` (whose code is `code`, its top-level statements at `spans` when known)
    with each statement and `with`/`for` header that has a line in `lines` black-formatted.
    Where the statements are comes from CPython's parse: only the statements are
    visited, no position computed."""
    located = _statement_lines(module, code, lines, spans)
    text = source_lines(code)
    touched: dict[cst.BaseStatement, int] = {}
    headers: dict[Header, int] = {}
    for statement, where in located.items():
        column = len(INDENT.match(text[where.own - 1]).group())  # type: ignore[union-attr]
        if isinstance(statement, cst.SimpleStatementLine) and not _is_string(statement):
            if any(line in lines for line in range(where.own, where.last + 1)):
                touched[statement] = column
        elif isinstance(statement, (cst.With, cst.For)):
            body = statement.body
            colon = (
                located[body.body[0]].first - 1
                if isinstance(body, cst.IndentedBlock)
                else where.last
            )
            if any(line in lines for line in range(where.own, colon + 1)):
                headers[statement] = column
    if not touched and not headers:
        return module
    lines_of_targets = [located[target].own for target in (*touched, *headers)]
    around = {
        statement
        for statement, where in located.items()
        if isinstance(statement, cst.BaseCompoundStatement)
        and any(where.own <= line <= where.last for line in lines_of_targets)
    }
    return module.visit(_FormatStatements(touched, headers, around))


def _is_string(statement: cst.SimpleStatementLine) -> bool:
    """A docstring, or any lone string: black alone takes it for a module docstring and
    would strip the indentation of its lines."""
    return (
        len(statement.body) == 1
        and isinstance(statement.body[0], cst.Expr)
        and isinstance(statement.body[0].value, (cst.SimpleString, cst.ConcatenatedString))
    )


def _statement_lines(
    module: cst.Module, code: str, lines: set[int], spans: Spans | None
) -> dict[cst.BaseStatement, StatementLines]:
    """The lines of the statements of `module` (whose code is `code`), at least of those
    in a top-level statement with a line in `lines`; none where CPython cannot parse
    `code` (the compile check reports it)."""
    found = None if spans is None else _lines_in_statements(code, lines, spans)
    if found is None:
        python = python_tree(code)
        found = {} if python is None else statement_lines(module, python)
    return found


def _lines_in_statements(
    code: str, lines: set[int], spans: Spans
) -> dict[cst.BaseStatement, StatementLines] | None:
    """`_statement_lines` from CPython's parse of each top-level statement with a line in
    `lines` on its own (of the whole module, ~10-40 ms at 2,000 lines, for each step that
    lengthens a line); None where one does not parse or match on its own."""
    starts = line_starts(code)
    wanted = sorted(lines)
    found: dict[cst.BaseStatement, StatementLines] = {}
    for statement, (start, end) in spans.items():
        first, last = bisect_right(starts, start), bisect_right(starts, end - 1)
        nearest = bisect_left(wanted, first)
        if nearest == len(wanted) or wanted[nearest] > last:
            continue
        python = python_tree(code[start:end])
        located = statement_lines(cst.Module(body=[statement]), python) if python else {}
        if not located:
            return None
        shift = first - 1
        for node, where in located.items():
            found[node] = StatementLines(*(line + shift for line in where))
    return found


_NEWLINE = re.compile(r"\r\n|\r|\n")


def _keep_untouched_bytes(before: str, after: str) -> str:
    """Put back what LibCST's code generation changes outside the rewrite: a form feed
    that starts a top-level statement's line (dropped), and in a file whose newline is
    not `\\n`, that newline on inserted lines (a docstring brings `\\n`)."""
    found = _NEWLINE.search(before)
    newline = found.group() if found else "\n"
    if newline == "\n" and "\f" not in before:
        return after
    old, new = source_lines(before, keepends=True), source_lines(after, keepends=True)

    def key(line: str) -> tuple[str, bool]:
        text = line.rstrip("\r\n")
        statement = text.lstrip("\f")  # LibCST keeps a line of form feeds only
        return statement if statement.strip() else text, len(text) < len(line)

    matcher = LineMatcher(list(map(key, old)), list(map(key, new)))
    kept: list[str] = []
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            kept += old[i1:i2]
        else:
            kept += [_NEWLINE.sub(newline, line) for line in new[j1:j2]]
    return "".join(kept)
