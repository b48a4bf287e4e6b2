"""Only inserted or changed code is black-formatted; everything else keeps its bytes."""

from __future__ import annotations

from autoaccel.formatting import format_inserted_code

LONG_CALL = "with torch.autocast(device_type='cuda' if torch.cuda.is_available() else 'cpu', dtype=torch.bfloat16):"


def test_changed_long_with_header_is_wrapped_and_body_kept():
    before = "def step(x):\n    y = model(x)  # keep   this   spacing\n"
    after = f"def step(x):\n    {LONG_CALL}\n        y = model(x)  # keep   this   spacing\n"
    formatted = format_inserted_code(before, after)
    assert formatted == (
        "def step(x):\n"
        "    with torch.autocast(\n"
        "        device_type='cuda' if torch.cuda.is_available() else 'cpu', dtype=torch.bfloat16\n"
        "    ):\n"
        "        y = model(x)  # keep   this   spacing\n"
    )
    assert all(len(line) <= 88 for line in formatted.splitlines())


def test_unchanged_long_lines_are_left_alone():
    source = f"{LONG_CALL}\n    y = model(x)\n"
    assert format_inserted_code(source, source + "z = 1\n") == source + "z = 1\n"


def test_changed_long_statement_is_wrapped_at_its_indentation():
    before = "if True:\n    x = 1\n"
    after = "if True:\n    data, target = data.to(device, non_blocking=True), target.to(device, non_blocking=True)\n"
    assert format_inserted_code(before, after) == (
        "if True:\n"
        "    data, target = data.to(device, non_blocking=True), target.to(\n"
        "        device, non_blocking=True\n"
        "    )\n"
    )


def test_short_changes_are_not_reformatted():
    before = "x = f( a )\n"
    after = "x = f( a, b )\n"
    assert format_inserted_code(before, after) == after
