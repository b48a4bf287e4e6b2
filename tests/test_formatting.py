"""Only inserted or changed code is black-formatted; everything else keeps its bytes."""

from __future__ import annotations

import libcst as cst
import pytest

from autoaccel.formatting import format_inserted_code, format_inserted_statements
from autoaccel.module_code import ModuleCode

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


def test_changed_long_for_header_is_wrapped_and_body_and_else_kept():
    """`--to ddp` shards the rows a loop's batch maker is passed (`shard_rows(train_x)`)."""
    before = (
        "for x, y in get_batches(train_x, train_y, args.batch_size, True):\n"
        "    step(x,  y)  # keep\n"
        "else:\n"
        "    done( )\n"
    )
    call = "get_batches(shard_rows(train_x), shard_rows(train_y), per_process_batch_size(args.batch_size), True)"
    after = before.replace("get_batches(train_x, train_y, args.batch_size, True)", call)
    assert format_inserted_code(before, after) == (
        "for x, y in get_batches(\n"
        "    shard_rows(train_x),\n"
        "    shard_rows(train_y),\n"
        "    per_process_batch_size(args.batch_size),\n"
        "    True,\n"
        "):\n"
        "    step(x,  y)  # keep\n"
        "else:\n"
        "    done( )\n"
    )


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


def test_an_inserted_long_docstring_keeps_the_indentation_of_its_lines():
    """Black given the docstring alone took it for a module's and dedented its second
    line (the `NoWriter` helper of `--to ddp` came out so)."""
    docstring = (
        '    """A SummaryWriter or wandb run for the ranks other than 0: it does nothing, whatever\n'
        '    it is asked."""\n'
    )
    after = "class NoWriter:\n" + docstring + "\n    def __call__(self):\n        return self\n"
    assert format_inserted_code("x = 1\n", after) == after


def test_short_changes_are_not_reformatted():
    before = "x = f( a )\n"
    after = "x = f( a, b )\n"
    assert format_inserted_code(before, after) == after


def test_statements_away_from_a_long_change_stay_the_nodes_they_were():
    # The next code generation reuses their text: they must be the same objects.
    before = "class A:\n    x = 1\n\n\ndef step(x):\n    y = model(x)\n\n\nif x:\n    z = 1\n"
    after = before.replace("    y = model(x)\n", f"    {LONG_CALL}\n        y = model(x)\n")
    tree = cst.parse_module(after)
    formatted, code = format_inserted_statements(before, tree, after, ModuleCode())
    assert code == formatted.code == format_inserted_code(before, after) != after
    assert formatted.body[0] is tree.body[0] and formatted.body[2] is tree.body[2]
    assert formatted.body[1] is not tree.body[1]


@pytest.mark.parametrize("newline", ["\n", "\r\n"])
def test_statements_parsed_alone_are_formatted_as_in_the_whole_module(newline):
    # Where the code generation knows the top-level statements' spans, CPython parses
    # only those with a changed long line: the lines it gives must be the module's.
    before = "# c\nimport torch\n\n\nclass A:\n    x = 1\n\n\ndef step(x):\n    # c\n    if x:\n        y = model(x)\n        z = 1\n"
    after = (
        before.replace("        y = model(x)\n", f"        {LONG_CALL}\n            y = model(x)\n")
        .replace(
            "z = 1", "z = data.to(device, non_blocking=True), target.to(device, non_blocking=True)"
        )
        .replace("\n", newline)
    )
    before = before.replace("\n", newline)
    tree = cst.parse_module(after)
    module_code = ModuleCode()
    assert module_code(tree) == after
    _, code = format_inserted_statements(before, tree, after, module_code)
    assert code == format_inserted_code(before, after) != after
