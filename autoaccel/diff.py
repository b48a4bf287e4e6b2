"""Unified diffs for humans: a 30-line change shows as 30 lines.

`difflib.unified_diff` uses the "autojunk" heuristic, which on long files treats
frequent lines (blank lines, closing brackets) as junk and inflates hunks. Without it,
`SequenceMatcher` compares each frequent line with every other (quadratic: 0.5 s per
diff of 8,000 lines); `LineMatcher` anchors the match on lines found once on each side
first, as patience diff does, and leaves `SequenceMatcher` the short stretches between.
"""

from __future__ import annotations

import difflib
import os
import sys
from bisect import bisect_left
from collections import Counter
from collections.abc import Hashable, Sequence
from functools import lru_cache
from typing import TextIO

from autoaccel.fileio import source_lines

CONTEXT = 3


class LineMatcher(difflib.SequenceMatcher):
    """`SequenceMatcher(autojunk=False)` for the lines of two versions of a file, in
    near-linear time: lines unique to both sides, in the same order, are matched first,
    then what lies between them is matched as difflib does."""

    def __init__(self, a: Sequence[Hashable], b: Sequence[Hashable]) -> None:
        super().__init__(None, a, b, autojunk=False)

    def get_matching_blocks(self) -> list[difflib.Match]:
        if self.matching_blocks is None:
            blocks: list[Run] = []
            _match(self.a, self.b, (0, len(self.a)), (0, len(self.b)), blocks)
            merged: list[Run] = []
            for i, j, size in blocks:
                last_i, last_j, last_size = merged[-1] if merged else (-1, -1, 0)
                if last_i + last_size == i and last_j + last_size == j:
                    merged[-1] = (last_i, last_j, last_size + size)
                elif size:
                    merged.append((i, j, size))
            merged.append((len(self.a), len(self.b), 0))
            self.matching_blocks = [difflib.Match(*block) for block in merged]
        return self.matching_blocks


Run = tuple[int, int, int]  # a[i:i + size] == b[j:j + size]


def _match(
    a: Sequence[Hashable],
    b: Sequence[Hashable],
    a_range: tuple[int, int],
    b_range: tuple[int, int],
    blocks: list[Run],
) -> None:
    """Append the matching blocks of `a[a_range]` and `b[b_range]`, in order: the runs
    of equal lines around the anchors, longest first (as `SequenceMatcher` takes its
    matches), then the stretches between, recursively."""
    (alo, ahi), (blo, bhi) = a_range, b_range
    runs: list[Run] = []
    for i, j in _unique_anchors(a, b, a_range, b_range):
        if runs and i < runs[-1][0] + runs[-1][2]:
            continue  # in the run of the anchor before
        first_i, first_j, end_i, end_j = i, j, i + 1, j + 1
        while first_i > alo and first_j > blo and a[first_i - 1] == b[first_j - 1]:
            first_i, first_j = first_i - 1, first_j - 1
        while end_i < ahi and end_j < bhi and a[end_i] == b[end_j]:
            end_i, end_j = end_i + 1, end_j + 1
        runs.append((first_i, first_j, end_i - first_i))
    if runs:
        _take_longest(a, b, runs, a_range, b_range, blocks)
    elif alo < ahi and blo < bhi:
        matcher = difflib.SequenceMatcher(None, a[alo:ahi], b[blo:bhi], autojunk=False)
        blocks += [(alo + i, blo + j, size) for i, j, size in matcher.get_matching_blocks()]


def _take_longest(
    a: Sequence[Hashable],
    b: Sequence[Hashable],
    runs: list[Run],
    a_range: tuple[int, int],
    b_range: tuple[int, int],
    blocks: list[Run],
) -> None:
    """The longest of `runs` within the ranges (the first in `a` of equals), then the
    same on each side of it; where no run is left, `_match` the stretch."""
    (alo, ahi), (blo, bhi) = a_range, b_range
    inside = []
    for i, j, size in runs:
        skip = max(alo - i, blo - j, 0)
        size = min(size, ahi - i, bhi - j) - skip
        if size > 0:
            inside.append((i + skip, j + skip, size))
    if not inside:
        _match(a, b, a_range, b_range, blocks)
        return
    i, j, size = max(inside, key=lambda run: (run[2], -run[0], -run[1]))
    _take_longest(a, b, inside, (alo, i), (blo, j), blocks)
    blocks.append((i, j, size))
    _take_longest(a, b, inside, (i + size, ahi), (j + size, bhi), blocks)


def _unique_anchors(
    a: Sequence[Hashable], b: Sequence[Hashable], a_range: tuple[int, int], b_range: tuple[int, int]
) -> list[tuple[int, int]]:
    """The longest chain, in order on both sides, of (i, j) with `a[i] == b[j]` a line
    found once in `a[a_range]` and once in `b[b_range]` (patience sorting)."""
    (alo, ahi), (blo, bhi) = a_range, b_range
    in_a, in_b = Counter(a[alo:ahi]), Counter(b[blo:bhi])
    where_in_b = {line: j for j, line in enumerate(b[blo:bhi], blo) if in_b[line] == 1}
    pairs = [
        (i, where_in_b[line])
        for i, line in enumerate(a[alo:ahi], alo)
        if in_a[line] == 1 and line in where_in_b
    ]
    tops: list[int] = []  # the j ending the best chain of each length
    ends: list[int] = []  # index in `pairs` of that chain's last pair
    previous: list[int] = []
    for index, (_, j) in enumerate(pairs):
        length = bisect_left(tops, j)
        previous.append(ends[length - 1] if length else -1)
        if length == len(tops):
            tops.append(j)
            ends.append(index)
        else:
            tops[length], ends[length] = j, index
    chain: list[tuple[int, int]] = []
    index = ends[-1] if ends else -1
    while index >= 0:
        chain.append(pairs[index])
        index = previous[index]
    return chain[::-1]


def unified_diff(before: str, after: str, path: str) -> str:
    a, b = source_lines(before, keepends=True), source_lines(after, keepends=True)
    matcher = LineMatcher(a, b)
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
    """The opcodes from the lines of `before` to those of `after`, computed once for
    each pair of texts: a conversion asks for the same pair for every line it reports."""
    return tuple(LineMatcher(_lines(before), _lines(after)).get_opcodes())


@lru_cache(maxsize=8)
def _lines(text: str) -> list[str]:
    """The lines of a text of the history, split once for its opcodes and for the lines
    a rewritten one may resemble (not to be changed: shared)."""
    return source_lines(text)


def original_line(history: list[tuple[str, str]], line: int) -> int:
    """Map a line of the last text in `history` (a chain of (before, after) texts)
    back to the first; a line inside a rewritten block maps to the old line it most
    resembles (`label = label.cuda()` to `label = Variable(label).cuda()`, not to the
    `else:` that went with the block's other lines), or to the same relative position."""
    for before, after in reversed(history):
        line = _line_before(before, after, line)
    return line


def inserted(before: str, after: str, line: int) -> bool:
    """Whether line `line` of `after` is one that `before` has nothing in place of."""
    return any(
        tag == "insert" and j1 < line <= j2 for tag, _, _, j1, j2 in line_opcodes(before, after)
    )


def _line_before(before: str, after: str, line: int) -> int:
    """The line of `before` that line `line` of `after` comes from. Lines deleted
    just above `line` are not it; a line past the end of `after` is as far past the
    end of `before`."""
    opcodes = line_opcodes(before, after)
    for tag, i1, i2, j1, j2 in opcodes:
        if j1 < line <= j2:
            offset = line - j1 - 1
            if tag == "equal":
                return i1 + offset + 1
            offset = min(max(i2 - i1 - 1, 0), offset * (i2 - i1) // max(j2 - j1, 1))
            return _resembled(before, after, (i1, i2), line - 1, i1 + offset) + 1
    _, _, before_end, _, after_end = opcodes[-1] if opcodes else ("equal", 0, 0, 0, 0)
    return line + before_end - after_end


# A rewritten line resembles an old one when difflib's ratio of the two reaches this;
# blocks longer than RESEMBLANCE_BLOCK lines are not searched (the ratio is quadratic).
RESEMBLANCE = 0.6
RESEMBLANCE_BLOCK = 40


def _resembled(before: str, after: str, block: tuple[int, int], new: int, fallback: int) -> int:
    """The line of `before` in `block` (0-based, end excluded) that line `new` of `after`
    most resembles, the nearer to `fallback` on a tie; `fallback` when none does."""
    start, end = block
    rewritten = _lines(after)
    if end - start > RESEMBLANCE_BLOCK or not start <= fallback < end or new >= len(rewritten):
        return fallback
    text, old = rewritten[new].strip(), _lines(before)
    score, _, found = max(
        (difflib.SequenceMatcher(None, old[i].strip(), text).ratio(), -abs(i - fallback), i)
        for i in range(start, end)
    )
    return found if score >= RESEMBLANCE else fallback


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
