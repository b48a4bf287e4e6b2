"""The module index resolves names and parents exactly as LibCST's providers do."""

from __future__ import annotations

import libcst as cst
import pytest
from libcst.metadata import (
    MetadataWrapper,
    ParentNodeProvider,
    QualifiedNameProvider,
    QualifiedNameSource,
)

from autoaccel.analysis.index import ModuleIndex
from autoaccel.analysis.names import canonical
from corpus import sources


def _resolved(value):
    return value() if callable(value) else value


@pytest.mark.parametrize("source", list(sources()))
def test_names_and_parents_match_libcst(source):
    module = cst.parse_module(source)
    wrapper = MetadataWrapper(module, unsafe_skip_copy=True)
    expected = wrapper.resolve(QualifiedNameProvider)
    parents = wrapper.resolve(ParentNodeProvider)
    index = ModuleIndex(module)
    for node in set(expected) | set(index.scopes):
        if isinstance(node, (cst.SimpleString, cst.ConcatenatedString)):
            continue  # string annotations are not resolved
        names = {
            canonical(q.name)
            for q in _resolved(expected.get(node, ()))
            if q.source is not QualifiedNameSource.LOCAL
        }
        assert index.qualified_names(node) == names, module.code_for_node(node)
    for child, parent in index.parents.items():
        assert parents[child] is parent
