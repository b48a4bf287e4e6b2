"""A module's code from the texts of the top-level statements it shares with the last
module generated: always what LibCST's `Module.code` writes."""

from __future__ import annotations

import libcst as cst
import pytest

from autoaccel.module_code import ModuleCode
from corpus import layouts, sources


@pytest.mark.parametrize("source", [*sources(), *layouts()])
def test_code_is_libcsts(source: str) -> None:
    module = cst.parse_module(source)
    assert ModuleCode()(module) == module.code


@pytest.mark.parametrize("source", [*sources(), *layouts()])
def test_code_of_a_rewrite_sharing_statements_is_libcsts(source: str) -> None:
    module = cst.parse_module(source)
    module_code = ModuleCode()
    module_code(module)
    body = module.body
    added = cst.parse_statement("import os\n")
    rewritten = module.with_changes(body=[*body[1:], added, *body[:1]])  # moved and new
    assert module_code(rewritten) == rewritten.code


def test_kept_statements_are_not_generated_again() -> None:
    module = cst.parse_module("x = 1\nif x:\n    y = 2\n")
    module_code = ModuleCode()
    module_code(module)
    # A text known for the node object is used as it is: a changed statement must be a
    # new node (LibCST's nodes are immutable, so a kept one writes the same text).
    module_code._texts[module.body[0]] = "x = 'known'\n"
    assert module_code(module) == "x = 'known'\nif x:\n    y = 2\n"


def test_statements_are_generated_again_in_another_layout() -> None:
    module = cst.parse_module("if x:\n    y = 2\n")
    module_code = ModuleCode()
    module_code(module)
    tabs = module.with_changes(default_indent="\t", default_newline="\r\n")
    assert module_code(tabs) == tabs.code == "if x:\r\n\ty = 2\r\n"


def test_statement_spans_are_where_each_is_in_the_code() -> None:
    module = cst.parse_module("# header\n\nx = 1\n\ndef f():\n    pass\n# footer\n")
    module_code = ModuleCode()
    text = module_code(module)
    spans = module_code.statement_spans(module)
    assert spans is not None
    assert [text[start:end] for start, end in spans.values()] == [
        "x = 1\n",
        "\ndef f():\n    pass\n",  # from its leading blank line
    ]
    other = cst.parse_module("y = 2\n")
    assert module_code.statement_spans(other) is None  # statements not generated here
