"""Markdown that text from a pull request (file names, diffs, error messages) cannot
break out of: a line of backticks inside a code block would close it, and whatever
follows would be the comment's own Markdown."""

from __future__ import annotations

import re

_BACKTICKS = re.compile(r"`+")


def _fence(text: str, shortest: int) -> str:
    """A run of backticks longer than any in `text` (CommonMark ends a code block or
    span at a run as long)."""
    longest = max((len(run) for run in _BACKTICKS.findall(text)), default=0)
    return "`" * max(shortest, longest + 1)


def code_block(text: str, info: str = "") -> str:
    """`text` as a fenced code block (`info`: its language, e.g. `diff`)."""
    fence = _fence(text, 3)
    return f"{fence}{info}\n{text}\n{fence}"


def inline_code(text: str) -> str:
    """`text` as a code span on one line (a newline would end a heading)."""
    text = re.sub(r"[\r\n]+", " ", text)
    fence = _fence(text, 1)
    padding = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{padding}{text}{padding}{fence}"


def table_cell(text: str) -> str:
    """`text` (Markdown) as a cell of a table row: on one line, and with each `|`
    escaped, which would end the cell even inside a code span."""
    return re.sub(r"[\r\n]+", " ", text).replace("|", "\\|")
