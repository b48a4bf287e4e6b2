"""Jupyter notebooks as Python scripts, and back.

The code cells are joined into one script that the linter and the converter read like
any other file: a marker comment opens each cell, and IPython-only lines (`%magic`,
`!shell`, `obj?`, and the lines a trailing backslash continues them onto) become `pass`
placeholders at the same indentation, so line numbers and blocks stay intact.
Positions in that script map back to cells and to the raw `.ipynb` text, and a
rewritten script is written back into the notebook by replacing only the `source` of
the cells that changed: metadata, outputs and formatting stay byte-identical. Cells
that start with a cell magic (`%%bash`, `%%time`) are left out.
"""

from __future__ import annotations

import ast
import bisect
import io
import json
import re
import tokenize
from dataclasses import dataclass, field
from pathlib import Path

from autoaccel.fileio import read_bytes

# A line IPython rewrites before Python sees it: `%magic`, `!cmd`, `?help`, `x = !cmd`,
# `x = %magic`, `obj?`.
_IPYTHON_LINE = re.compile(r"\s*(?:[%!?]|[\w.]+\s*=\s*[%!]|[\w.]+\?{1,2}\s*$)")
_CELL_MAGIC = re.compile(r"\s*%%")
_MARKER = "# %% autoaccel cell {}"
_MARKER_LINE = re.compile(r"# %% autoaccel cell (\d+)\n?")
_HEADER = "# %% [cell {}]\n"  # a marker as `Notebook.render` shows it
_HEADER_LINE = re.compile(r"# %% \[cell (\d+)\]\n?")
_PLACEHOLDER = "pass  # autoaccel ipython line {}"
_PLACEHOLDER_LINE = re.compile(r"(\s*)pass  # autoaccel ipython line (\d+)(\n?)")
_WHITESPACE = re.compile(r"[ \t\r\n]*")


class NotebookError(Exception):
    """A notebook that cannot be read, or a rewrite that cannot be put back into it."""


@dataclass(frozen=True)
class CellRange:
    """Where a range of the joined script is in the notebook (all 1-based)."""

    cell: int  # counts every cell, markdown included, as the notebook shows them
    line: int
    column: int
    end_line: int
    end_column: int

    def __str__(self) -> str:
        """Ruff's notation, which editors and terminals can follow: `cell 3:3:10`."""
        return f"cell {self.cell}:{self.line}:{self.column}"


@dataclass
class _Span:
    """Where a JSON value is in the notebook text, with its members' spans."""

    start: int
    end: int
    members: dict[str, _Span] | list[_Span] | None = None


@dataclass
class _CodeCell:
    number: int
    lines: list[str]  # the cell's source lines, without newlines
    ends_with_newline: bool
    source: _Span  # the JSON value of the cell's "source"
    pieces: list[str]  # the decoded JSON strings of "source" (one, or one per line)
    line_starts: list[tuple[int, int]] = field(default_factory=list)  # (piece, offset)
    python_lines: list[str] = field(default_factory=list)  # as in the joined script


class Notebook:
    """A parsed `.ipynb` text; `python` is its code cells as one script."""

    def __init__(self, text: str) -> None:
        self.text = text
        try:
            data = json.loads(text)
            root = _scan(text, 0)
        except (ValueError, IndexError) as error:
            raise NotebookError(f"not a notebook: {error}") from None
        except RecursionError:
            raise NotebookError("not a notebook: JSON nested too deeply") from None
        _check_structure(data)
        self.cells = _code_cells(data, root) if _is_python(data) else []
        self.ipython_lines: list[str] = []
        # Lines that continue the IPython line before them, with that line's indentation.
        self._continued: dict[int, str] = {}
        self.python = self._join()
        self._marker_lines = [
            number
            for number, line in enumerate(self.python.splitlines(), 1)
            if _MARKER_LINE.fullmatch(line)
        ]

    def _join(self) -> str:
        lines: list[str] = []
        for cell in self.cells:
            indent: str | None = None  # the IPython command's, while a `\` continues it
            for line in cell.lines:
                python_line = line
                if indent is not None:
                    # IPython joins the lines after a trailing `\` into the command
                    # (`!pip install a \` then `    b`): masked at the command's indentation.
                    self._continued[len(self.ipython_lines)] = indent
                elif _IPYTHON_LINE.match(line) and _statement_starts_after(cell.python_lines):
                    indent = line[: len(line) - len(line.lstrip())]
                if indent is not None:
                    python_line = indent + _PLACEHOLDER.format(len(self.ipython_lines))
                    self.ipython_lines.append(line)
                    if not line.endswith("\\"):
                        indent = None
                cell.python_lines.append(python_line)
            lines += [_MARKER.format(cell.number), *cell.python_lines]
        return "".join(line + "\n" for line in lines)

    # -- positions ------------------------------------------------------------------
    def cell_range(self, line: int, column: int, end_line: int, end_column: int) -> CellRange:
        """A range of `python` in cell terms (a statement never spans two cells)."""
        index = self._cell_index(line)
        first = self._marker_lines[index]
        return CellRange(
            self.cells[index].number,
            max(line - first, 1),
            column,
            max(end_line - first, 1),
            end_column,
        )

    def _cell_index(self, line: int) -> int:
        return max(bisect.bisect_right(self._marker_lines, line) - 1, 0)

    def file_position(self, line: int, column: int) -> tuple[int, int]:
        """`line`:`column` of `python` as a line and column of the `.ipynb` text,
        where the character sits inside its JSON string (what editors and GitHub show)."""
        index = self._cell_index(line)
        cell = self.cells[index]
        cell_line = min(max(line - self._marker_lines[index], 1), len(cell.line_starts))
        if not cell.line_starts:
            return _line_and_column(self.text, cell.source.start)
        piece, offset = cell.line_starts[cell_line - 1]
        prefix = cell.pieces[piece][: offset + column - 1]
        escaped = json.dumps(prefix, ensure_ascii=False)[1:-1]
        start = _string_starts(cell)[piece]
        return _line_and_column(self.text, start + 1 + len(escaped))

    # -- rewriting --------------------------------------------------------------------
    def render(self, python: str) -> str:
        """`python` (this notebook's script or a rewrite of it) as a readable percent
        script: `# %% [cell N]` headers and the IPython lines as written."""
        lines = python.splitlines(keepends=True)
        for index, line in enumerate(lines):
            marker = _MARKER_LINE.fullmatch(line)
            if marker:
                lines[index] = _HEADER.format(marker.group(1))
            else:
                lines[index] = self._restore(line)
        return "".join(lines)

    def _restore(self, line: str) -> str:
        placeholder = _PLACEHOLDER_LINE.fullmatch(line)
        if placeholder is None:
            return line
        indent, number, newline = placeholder.groups()
        original = self.ipython_lines[int(number)]
        head = self._continued.get(int(number))
        if head is None:
            return indent + original.lstrip() + newline
        # A continuation keeps its indentation relative to the command's (as written
        # when it has less).
        if not original.startswith(head):
            return original + newline
        return indent + original[len(head) :] + newline

    def with_python(self, python: str) -> str:
        """The notebook text with `python` (a rewrite of `self.python`) put back: only
        the changed cells' `source` values are replaced. Raises `NotebookError` when
        the rewrite moved code across cells or lost an IPython line."""
        chunks = _split_cells(python)
        if [number for number, _ in chunks] != [cell.number for cell in self.cells]:
            raise NotebookError("the rewrite moved or removed a cell boundary")
        kept = [line for _, lines in chunks for line in lines if _PLACEHOLDER_LINE.fullmatch(line)]
        if len(kept) != len(self.ipython_lines):
            raise NotebookError("the rewrite lost an IPython line (magic or shell escape)")
        if not self._continuations_kept(chunks):
            raise NotebookError("the rewrite split an IPython line continued with `\\`")
        text = self.text
        for cell, (_, lines) in reversed(list(zip(self.cells, chunks))):
            new_lines = [line.rstrip("\n") for line in lines]
            if new_lines == cell.python_lines:
                continue
            _check_compiles(cell.number, new_lines)
            source = "\n".join(self._restore(line) for line in new_lines)
            source += "\n" if cell.ends_with_newline else ""
            encoded = _encode_source(text, cell.source, source)
            text = text[: cell.source.start] + encoded + text[cell.source.end :]
        return text

    def _continuations_kept(self, chunks: list[tuple[int, list[str]]]) -> bool:
        """Whether each continuation line of an IPython command still directly follows
        the line it continues (IPython would run whatever came between as the command)."""
        for _, lines in chunks:
            before = None
            for line in lines:
                placeholder = _PLACEHOLDER_LINE.fullmatch(line)
                number = int(placeholder.group(2)) if placeholder else None
                if number is not None and number in self._continued and before != number - 1:
                    return False
                before = number
        return True


def read_notebook(path: Path) -> Notebook:
    """Read a `.ipynb` file (UTF-8, as nbformat writes it)."""
    return Notebook(read_bytes(path).decode("utf-8"))


def is_notebook(path: Path) -> bool:
    return path.suffix == ".ipynb"


def rendered_cell_line(rendered: str, line: int) -> tuple[int, int]:
    """Where line `line` of a `Notebook.render` text is in the notebook: its cell's
    number and its line in the cell (1-based), as `Notebook.cell_range` gives them."""
    cell, header = 1, 0
    for number, text in enumerate(rendered.splitlines(keepends=True)[:line], 1):
        found = _HEADER_LINE.fullmatch(text)
        if found:
            cell, header = int(found.group(1)), number
    return cell, max(line - header, 1)


# -- reading ------------------------------------------------------------------------------
def _scan(text: str, position: int) -> _Span:
    """The span of the JSON value at `position`, with the spans of its members;
    strings and numbers are decoded by the standard library's scanner."""
    start = position = _WHITESPACE.match(text, position).end()  # type: ignore[union-attr]
    opening = text[position]
    if opening not in "{[":
        _, end = _DECODER.raw_decode(text, position)
        return _Span(start, end)
    closing = "}" if opening == "{" else "]"
    members: dict[str, _Span] | list[_Span] = {} if opening == "{" else []
    position = _WHITESPACE.match(text, position + 1).end()  # type: ignore[union-attr]
    while text[position] != closing:
        if isinstance(members, dict):
            key, position = _DECODER.raw_decode(text, position)
            position = _WHITESPACE.match(text, position).end()  # type: ignore[union-attr]
            if text[position] != ":":
                raise ValueError(f"expected ':' at offset {position}")
            value = _scan(text, position + 1)
            members[key] = value
        else:
            value = _scan(text, position)
            members.append(value)
        position = _WHITESPACE.match(text, value.end).end()  # type: ignore[union-attr]
        if text[position] == ",":
            position = _WHITESPACE.match(text, position + 1).end()  # type: ignore[union-attr]
        elif text[position] != closing:
            raise ValueError(f"expected ',' or {closing!r} at offset {position}")
    return _Span(start, position + 1, members)


_DECODER = json.JSONDecoder()


def _check_structure(data: object) -> None:
    """Raise `NotebookError` unless the values this module reads have nbformat 4's
    types: `cells` a list of objects, a code cell's `source` a string or a list of
    strings, `metadata` (and its `language_info`, `kernelspec`) objects."""
    if not isinstance(data, dict) or not isinstance(data.get("cells"), list):
        raise NotebookError("not a notebook in nbformat 4 (no top-level `cells` list)")
    metadata = data.get("metadata", {})
    if not isinstance(metadata, dict):
        raise NotebookError("not a notebook: `metadata` is not an object")
    for key in ("language_info", "kernelspec"):
        if not isinstance(metadata.get(key, {}), dict):
            raise NotebookError(f"not a notebook: `metadata.{key}` is not an object")
    for number, cell in enumerate(data["cells"], 1):
        if not isinstance(cell, dict):
            raise NotebookError(f"not a notebook: cell {number} is not an object")
        source = cell.get("source", "")
        pieces = source if isinstance(source, list) else [source]
        if not all(isinstance(piece, str) for piece in pieces):
            raise NotebookError(f"not a notebook: the source of cell {number} is not text")


def _is_python(data: dict) -> bool:
    metadata = data.get("metadata") or {}
    language = (metadata.get("language_info") or {}).get("name") or (
        metadata.get("kernelspec") or {}
    ).get("language")
    return language in (None, "python")


def _code_cells(data: dict, root: _Span) -> list[_CodeCell]:
    cells = []
    spans = root.members["cells"].members  # type: ignore[index, union-attr]
    for number, (cell, span) in enumerate(zip(data["cells"], spans), 1):
        if cell.get("cell_type") != "code" or "source" not in cell:
            continue
        pieces = cell["source"] if isinstance(cell["source"], list) else [cell["source"]]
        text = "".join(pieces)
        if _CELL_MAGIC.match(text):
            continue
        lines = text.split("\n")
        if text.endswith("\n"):
            lines.pop()
        code = _CodeCell(number, lines, text.endswith("\n"), span.members["source"], pieces)
        code.line_starts = _line_starts(pieces)
        cells.append(code)
    return cells


def _statement_starts_after(lines: list[str]) -> bool:
    """Whether a new statement may start after `lines`: not inside brackets, a string
    or a backslash continuation (`"%d" % n` continued on a line of its own is Python)."""
    text = "".join(line + "\n" for line in lines)
    try:
        for _ in tokenize.generate_tokens(io.StringIO(text).readline):
            pass
    except (tokenize.TokenError, SyntaxError):
        return False
    return True


def _line_starts(pieces: list[str]) -> list[tuple[int, int]]:
    """(piece, offset) where each line of the joined pieces begins."""
    starts = []
    at_line_start = True
    for index, piece in enumerate(pieces):
        if at_line_start and piece:
            starts.append((index, 0))
        starts += [(index, o + 1) for o, c in enumerate(piece[:-1]) if c == "\n"]
        if piece:
            at_line_start = piece.endswith("\n")
    return starts or [(0, 0)]


def _string_starts(cell: _CodeCell) -> list[int]:
    """Offsets of the opening quotes of the cell's source strings."""
    members = cell.source.members
    return [span.start for span in members] if isinstance(members, list) else [cell.source.start]


def _line_and_column(text: str, offset: int) -> tuple[int, int]:
    return text.count("\n", 0, offset) + 1, offset - text.rfind("\n", 0, offset)


# -- writing --------------------------------------------------------------------------------
def _split_cells(python: str) -> list[tuple[int, list[str]]]:
    """(cell number, lines) per marker; lines before the first marker join the first cell."""
    chunks: list[tuple[int, list[str]]] = []
    leading: list[str] = []
    for line in python.splitlines(keepends=True):
        marker = _MARKER_LINE.fullmatch(line)
        if marker:
            chunks.append((int(marker.group(1)), leading if not chunks else []))
            leading = []
        elif chunks:
            chunks[-1][1].append(line)
        else:
            leading.append(line)
    return chunks


def _check_compiles(number: int, lines: list[str]) -> None:
    try:
        source = "\n".join(lines) + "\n"
        compile(
            source, f"<cell {number}>", "exec", ast.PyCF_ALLOW_TOP_LEVEL_AWAIT, dont_inherit=True
        )
    except SyntaxError as error:
        raise NotebookError(
            f"the rewritten cell {number} does not compile on its own: {error.msg}"
        ) from None


def _encode_source(text: str, span: _Span, source: str) -> str:
    """`source` as JSON in the style of the value at `span` (a list of lines, one per
    file line with the same indentation, or a single string)."""
    if not isinstance(span.members, list):
        return json.dumps(source, ensure_ascii=False)
    lines = [json.dumps(line, ensure_ascii=False) for line in source.splitlines(keepends=True)]
    if span.members:
        opening = text[span.start + 1 : span.members[0].start]
        closing = text[span.members[-1].end : span.end - 1]
    else:
        newline = "\r\n" if "\r\n" in text else "\n"
        indent = text[text.rfind("\n", 0, span.start) + 1 : span.start]
        indent = indent[: len(indent) - len(indent.lstrip())]
        opening, closing = newline + indent + " ", newline + indent
    if not lines:
        return "[]"
    return "[" + opening + ("," + opening).join(lines) + closing + "]"
