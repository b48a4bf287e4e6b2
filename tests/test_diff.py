"""`LineMatcher`: difflib's line matching (autojunk off), in near-linear time."""

from __future__ import annotations

import difflib
from pathlib import Path

import pytest

from autoaccel.diff import LineMatcher

ROOT = Path(__file__).resolve().parent.parent
CONVERSIONS = sorted((ROOT / "tests" / "snapshots").glob("*.ddp.py"))


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines()


@pytest.mark.parametrize("converted", CONVERSIONS, ids=lambda path: path.name)
def test_line_matcher_finds_what_difflib_finds_in_a_conversion(converted: Path) -> None:
    original = _lines(ROOT / "fixtures" / converted.name.replace(".ddp", ""))
    # Four copies: a longer file whose lines repeat, edited in four places.
    before, after = original * 4, _lines(converted) * 4
    expected = difflib.SequenceMatcher(None, before, after, autojunk=False).get_opcodes()
    assert LineMatcher(before, after).get_opcodes() == expected


@pytest.mark.parametrize(
    "before, after",
    [
        pytest.param(["a", "", "b", ""], ["", "a", "", "c", ""], id="no-unique-line-in-common"),
        pytest.param(
            ["import a", "", "", "def f():"],
            ["import a", "", "X = 1", "", "", "def f():"],
            id="blank-lines-go-with-the-longer-match",
        ),
        pytest.param([], ["a"], id="from-empty"),
        pytest.param(["a", "b"], ["a", "b"], id="equal"),
    ],
)
def test_line_matcher_finds_what_difflib_finds(before: list[str], after: list[str]) -> None:
    expected = difflib.SequenceMatcher(None, before, after, autojunk=False).get_opcodes()
    assert LineMatcher(before, after).get_opcodes() == expected


def test_line_matcher_opcodes_rebuild_the_new_lines() -> None:
    # A line repeated around a deletion can be matched either way; any match must
    # still turn the old lines into the new ones and keep as many lines.
    before = ["def f(x):", "    return x", ""] * 300
    after = ["import os", *before[:700], *before[701:]]
    opcodes = LineMatcher(before, after).get_opcodes()
    rebuilt = [
        line
        for tag, i1, i2, j1, j2 in opcodes
        for line in (before[i1:i2] if tag == "equal" else after[j1:j2])
    ]
    kept = sum(i2 - i1 for tag, i1, i2, _, _ in opcodes if tag == "equal")
    assert rebuilt == after and kept == len(before) - 1
