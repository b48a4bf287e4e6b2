"""Positions are exactly LibCST's `PositionProvider` ranges, for every node."""

from __future__ import annotations

import libcst as cst
import pytest
from libcst.metadata import MetadataWrapper, PositionProvider

from autoaccel.analysis.index import ModuleIndex
from autoaccel.analysis.positions import Positions, SourcePositions
from autoaccel.lint.engine import parse_checked
from corpus import sources

LAYOUTS = {
    "crlf": "x = 1\r\nif x:\r\n    y = (\r\n  2)\r\n",
    "no-final-newline": "import torch\nloss = torch.zeros(1).cuda()",
    "decorators": "@d\n\n# c\n@e(1)\ndef f(a, *, b): return a; pass\nclass C: pass\n",
    "compound": (
        "if a: b\nelif c: d\nelse:\n  e\ntry:\n  pass\nexcept E as e:\n  pass\n"
        "finally:\n  pass\nwith a as b, c: pass\nmatch x:\n  case [1, *r] if r: pass\n"
    ),
    "nested": (
        "def f(x):\n\tif x:\n\t\tpass\n  # odd comment\n\telif y:  # c\n\t\tz = \\\n  1\n"
        "\telse: a; b\n\n\nclass C:\n    @staticmethod\n    # c\n    @d\n    def g(): ...\n"
    ),
    "form-feed": "x = 1\n\n\x0cclass C:\n    pass\n",
    "comments-only": "\n\n# only a comment",
    "empty": "",
}


@pytest.mark.parametrize(
    "source",
    [*sources(), *(pytest.param(text, id=name) for name, text in LAYOUTS.items())],
)
def test_ranges_match_libcst(source):
    module = cst.parse_module(source)
    expected = MetadataWrapper(module, unsafe_skip_copy=True).resolve(PositionProvider)
    positions = Positions(module)
    assert set(positions) == set(expected)
    mismatched = [
        (module.code_for_node(node), expected[node], positions[node])
        for node in expected
        if positions[node] != expected[node]
    ]
    assert mismatched == []


@pytest.mark.parametrize(
    "source",
    [*sources(), *(pytest.param(text, id=name) for name, text in LAYOUTS.items())],
)
def test_statement_ranges_match_libcst(source):
    """Lint generates only the statement around a node, from the line CPython gives."""
    module, tree = parse_checked(source)
    expected = MetadataWrapper(module, unsafe_skip_copy=True).resolve(PositionProvider)
    parents = ModuleIndex(module).parents
    positions = SourcePositions(module, source, tree, parents)
    in_statements = [node for node in parents if not isinstance(node, cst.Module)]
    assert [positions[node] for node in in_statements] == [expected[n] for n in in_statements]
    # No node needed the whole module generated, but where a form feed starts a line
    # (LibCST counts it in the indentation, which then differs from the line's).
    assert (positions._whole is None) is ("\x0c" not in source)
    assert all(positions[node] == expected[node] for node in expected)
