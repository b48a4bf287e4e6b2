"""Unified diffs for humans: a 30-line change shows as 30 lines.

`difflib.unified_diff` uses the "autojunk" heuristic, which on long files treats
frequent lines (blank lines, closing brackets) as junk and inflates hunks.
"""

from __future__ import annotations

import difflib
import os
import sys
from functools import lru_cache
from typing import TextIO

from autoaccel.fileio import source_lines

CONTEXT = 3


def unified_diff(before: str, after: str, path: str) -> str:
    a, b = source_lines(before, keepends=True), source_lines(after, keepends=True)
    matcher = difflib.SequenceMatcher(a=a, b=b, autojunk=False)
    out: list[str] = []
    for group in matcher.get_grouped_opcodes(CONTEXT):
        if not out:
            out += [f"--- {path}\n", f"+++ {path}\n"]
        first, last = group[0], group[-1]
        old_start, old_len = first[1], last[2] - first[1]
        new_start, new_len = first[3], last[4] - first[3]
        out.append(
            f"@@ -{old_start + (old_len > 0)},{old_len} +{new_start + (new_len > 0)},{new_len} @@\n"
        )
        for tag, i1, i2, j1, j2 in group:
            if tag == "equal":
                out += [" " + line for line in a[i1:i2]]
                continue
            out += ["-" + line for line in a[i1:i2]]
            out += ["+" + line for line in b[j1:j2]]
    return "".join(
        line if line.endswith(("\n", "\r")) else line + "\n\\ No newline at end of file\n"
        for line in out
    )


@lru_cache(maxsize=16)
def line_opcodes(before: str, after: str) -> tuple[tuple[str, int, int, int, int], ...]:
    """`SequenceMatcher(autojunk=False)`'s opcodes from the lines of `before` to those
    of `after`, computed once for each pair of texts: a conversion asks for the same
    pair for every line it reports, and on long files the match costs more than
    linear time (each blank line is compared with every other)."""
    matcher = difflib.SequenceMatcher(a=source_lines(before), b=source_lines(after), autojunk=False)
    return tuple(matcher.get_opcodes())


def original_line(history: list[tuple[str, str]], line: int) -> int:
    """Map a line of the last text in `history` (a chain of (before, after) texts)
    back to the first; a line inside a rewritten block maps to the same relative
    position in the old block."""
    for before, after in reversed(history):
        for tag, i1, i2, j1, j2 in line_opcodes(before, after):
            if j1 < line <= j2 or j1 == j2 == line - 1:
                offset = line - j1 - 1
                if tag != "equal":  # proportional position inside a rewritten block
                    offset = min(max(i2 - i1 - 1, 0), offset * (i2 - i1) // max(j2 - j1, 1))
                line = i1 + offset + 1
                break
    return line


def use_colour(stream: TextIO | None = None) -> bool:
    """Colour on a terminal (`stream`, default: the current stdout) or with FORCE_COLOR
    set, never with NO_COLOR set (it wins, as in pytest)."""
    if os.environ.get("NO_COLOR"):
        return False
    return bool(os.environ.get("FORCE_COLOR")) or (stream or sys.stdout).isatty()


# ANSI styles of terminal output.
BOLD, RED, GREEN, CYAN = "1", "31", "32", "36"


def paint(text: str, *styles: str) -> str:
    """`text` in the ANSI `styles` (`paint("E1", BOLD, RED)`)."""
    return f"\033[{';'.join(styles)}m{text}\033[0m"


def colourize(diff: str) -> str:
    colours = {"+": GREEN, "-": RED, "@": CYAN}
    lines = []
    for line in source_lines(diff, keepends=True):
        colour = None if line.startswith(("+++", "---")) else colours.get(line[:1])
        lines.append(paint(line.rstrip("\n"), colour) + "\n" if colour else line)
    return "".join(lines)
