"""Positions are exactly LibCST's `PositionProvider` ranges, for every node."""

from __future__ import annotations

import libcst as cst
import pytest
from libcst.metadata import MetadataWrapper, PositionProvider

from autoaccel.analysis.positions import Positions
from corpus import sources

LAYOUTS = {
    "crlf": "x = 1\r\nif x:\r\n    y = (\r\n  2)\r\n",
    "no-final-newline": "import torch\nloss = torch.zeros(1).cuda()",
    "decorators": "@d\n\n# c\n@e(1)\ndef f(a, *, b): return a; pass\nclass C: pass\n",
    "compound": (
        "if a: b\nelif c: d\nelse:\n  e\ntry:\n  pass\nexcept E as e:\n  pass\n"
        "finally:\n  pass\nwith a as b, c: pass\nmatch x:\n  case [1, *r] if r: pass\n"
    ),
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
