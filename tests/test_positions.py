"""Positions are exactly LibCST's `PositionProvider` ranges, for every node."""

from __future__ import annotations

import libcst as cst
import pytest
from libcst.metadata import MetadataWrapper, PositionProvider

from autoaccel.analysis.index import ModuleIndex
from autoaccel.analysis.positions import Positions, SourcePositions, TopLevelPositions
from autoaccel.module_code import ModuleCode
from autoaccel.source import parse_checked
from corpus import layouts, sources


@pytest.mark.parametrize("source", [*sources(), *layouts()])
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


@pytest.mark.parametrize("source", [*sources(), *layouts()])
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


@pytest.mark.parametrize("source", [*sources(), *layouts()])
def test_top_level_statement_ranges_match_libcst(source):
    """A converted tree's positions come from its top-level statements, where they
    start being known from its code generation."""
    module = cst.parse_module(source)
    expected = MetadataWrapper(module, unsafe_skip_copy=True).resolve(PositionProvider)
    module_code = ModuleCode()
    text = module_code(module)
    spans = module_code.statement_spans(module)
    if not module.has_trailing_newline:
        assert spans is None  # then CPython's parse tells (`SourcePositions`)
        return
    assert spans is not None
    positions = TopLevelPositions(module, text, spans, ModuleIndex(module).parents)
    assert all(positions[node] == expected[node] for node in ModuleIndex(module).parents)
    assert positions._whole is None  # each from its top-level statement
    assert all(positions[node] == expected[node] for node in expected)
