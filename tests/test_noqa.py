"""`# noqa` and `# noqa: CODE` suppress findings on their line, and their fixes."""

from __future__ import annotations

import pytest
from conftest import SCRIPT, SELECT

from autoaccel.config import LintSettings
from autoaccel.lint.engine import lint_source
from autoaccel.lint.fixer import fix_source
from autoaccel.lint.noqa import ALL, suppressions

BOTH = LintSettings(select=("ACC101", "ACC102"), unsafe_fixes=True)
LOADER = "loader = DataLoader(dataset, batch_size=32)"


def with_comment(comment: str) -> str:
    return SCRIPT.replace(LOADER, f"{LOADER}  {comment}")


def codes(source: str) -> list[str]:
    return [d.code for d in lint_source(source, BOTH)]


@pytest.mark.parametrize(
    ("comment", "expected"),
    [
        ("# noqa", []),
        ("# NOQA", []),
        ("#noqa", []),
        ("# noqa: ACC101", ["ACC102"]),
        ("# noqa:ACC102", ["ACC101"]),
        ("# noqa: acc101", ["ACC102"]),
        ("# noqa: ACC101, ACC102", []),
        ("# noqa: ACC101 ACC102", []),
        ("# noqa: ACC999", ["ACC101", "ACC102"]),
        ("# type: ignore  # noqa: ACC101", ["ACC102"]),
        ("# a comment", ["ACC101", "ACC102"]),
    ],
)
def test_noqa_comment(comment, expected):
    assert codes(with_comment(comment)) == expected


def test_noqa_on_another_line_does_not_suppress():
    source = SCRIPT.replace("model.cuda()", "model.cuda()  # noqa")
    assert codes(source) == ["ACC101", "ACC102"]


def test_noqa_inside_a_string_is_not_a_comment():
    source = SCRIPT.replace("batch_size=32)", 'batch_size=32, note="# noqa")')
    assert codes(source) == ["ACC101", "ACC102"]


def test_noqa_after_the_closing_bracket_of_a_multiline_call():
    source = SCRIPT.replace(
        LOADER, "loader = DataLoader(\n    dataset, batch_size=32\n)  # noqa: ACC101"
    )
    assert codes(source) == ["ACC102"]


def test_suppressions_table():
    table = suppressions("x = 1  # noqa\ny = 2\nz = 3  # noqa: ACC101,ACC205\n")
    assert table == {1: ALL, 3: frozenset({"ACC101", "ACC205"})}


def test_suppressions_of_untokenizable_source_are_partial_not_an_error():
    assert suppressions('x = 1  # noqa\ny = """unterminated\n') == {1: ALL}


@pytest.mark.parametrize("comment", ["# noqa", "# noqa: ACC101, ACC102"])
def test_fix_is_not_applied_on_a_suppressed_line(cli, tmp_path, comment):
    source = with_comment(comment)
    (tmp_path / "train.py").write_text(source)
    run = cli("lint", *SELECT, "--fix", "--unsafe-fixes", "train.py")
    assert (run.exit_code, run.stdout) == (0, "")
    assert (tmp_path / "train.py").read_text() == source


def test_only_the_unsuppressed_fix_is_applied():
    result = fix_source(with_comment("# noqa: ACC101"), BOTH)
    assert "pin_memory=torch.cuda.is_available()" in result.source
    assert "num_workers" not in result.source
    assert "# noqa: ACC101" in result.source
    assert result.remaining == []
