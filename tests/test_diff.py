"""`LineMatcher`: difflib's line matching (autojunk off), in near-linear time."""

from __future__ import annotations

import difflib
from pathlib import Path

import pytest

from autoaccel.diff import LineMatcher, original_line

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


# -- lines reported in the original ------------------------------------------------------------
BRANCHES = """\
if use_gpu:
    img = Variable(img).cuda()
    label = Variable(label).cuda()
else:
    img = Variable(img)
    label = Variable(label)
out = model(img)
"""
UNWRAPPED = """\
if use_gpu:
    img = img.cuda()
    label = label.cuda()
out = model(img)
"""


@pytest.mark.parametrize(
    "history, line, expected",
    [
        # A rewritten line maps to the old line it resembles, not to the `else:` that
        # sits at its relative position in the block that shrank.
        pytest.param([(BRANCHES, UNWRAPPED)], 3, 3, id="resembled-line"),
        pytest.param([(BRANCHES, UNWRAPPED)], 4, 7, id="equal-line-after-the-block"),
        # Inserted lines resemble nothing: the relative position.
        pytest.param(
            [("x = 1\ny = f(x)\n", "x = 1\nwith torch.autocast('cuda'):\n    y = f(x)\n")],
            2,
            2,
            id="inserted-line",
        ),
        # A line below deleted lines is itself, not the first deleted line.
        pytest.param(
            [("import a\nimport b\nimport c\n", "import a\nimport c\n")],
            2,
            3,
            id="line-after-a-deletion",
        ),
        # Through two rewrites.
        pytest.param(
            [
                (BRANCHES, UNWRAPPED),
                (UNWRAPPED, UNWRAPPED.replace(".cuda()", ".cuda(non_blocking=True)")),
            ],
            3,
            3,
            id="chain",
        ),
    ],
)
def test_original_line(history, line, expected) -> None:
    assert original_line(history, line) == expected
