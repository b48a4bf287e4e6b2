"""The module index resolves names and parents exactly as LibCST's providers do."""

from __future__ import annotations

from functools import cache

import libcst as cst
import pytest
from libcst.metadata import (
    MetadataWrapper,
    ParentNodeProvider,
    QualifiedNameProvider,
    QualifiedNameSource,
    ScopeProvider,
)

from autoaccel.analysis.index import ModuleIndex, repeats_a_node, repeats_a_node_since
from autoaccel.analysis.names import canonical
from corpus import sources


def _resolved(value):
    return value() if callable(value) else value


@cache
def _parsed(source: str) -> tuple[cst.Module, MetadataWrapper, ModuleIndex]:
    """One parse, LibCST's providers and the index per source, shared by the tests
    (the providers' results are computed once per wrapper)."""
    module = cst.parse_module(source)
    return module, MetadataWrapper(module, unsafe_skip_copy=True), ModuleIndex(module)


@pytest.mark.parametrize("source", list(sources()))
def test_names_and_parents_match_libcst(source):
    module, wrapper, index = _parsed(source)
    expected = wrapper.resolve(QualifiedNameProvider)
    parents = wrapper.resolve(ParentNodeProvider)
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


def test_global_statement_at_module_level_names_the_module_binding():
    # `global config` under `if __name__ == "__main__":` once sent `Scope.owner`
    # into infinite recursion (lint: internal error).
    module = cst.parse_module(
        "from torch import nn\nconfig = 1\nif __name__ == '__main__':\n"
        "    global config\n    config = nn.Linear(1, 1)\n    print(config)\n"
    )
    index = ModuleIndex(module)
    call = module.body[2].body.body[1].body[0].value
    assert index.qualified_names(call.func) == {"torch.nn.Linear"}


@pytest.mark.parametrize("source", list(sources()))
def test_bindings_and_reads_match_libcst_scopes(source):
    module, wrapper, index = _parsed(source)
    scopes = wrapper.resolve(ScopeProvider)
    for node, scope in scopes.items():
        if not isinstance(node, cst.Name) or scope is None or node not in index.scopes:
            continue
        statements = [getattr(a, "node", None) for a in scope[node.value]]
        expected = [s if isinstance(s, (cst.Import, cst.ImportFrom)) else None for s in statements]
        assert sorted(map(id, index.bindings(node.value, node))) == sorted(
            map(id, expected)
        ), module.code_for_node(node)
    for scope in set(scopes.values()) - {None}:
        for assignment in scope.assignments:
            if isinstance(getattr(assignment, "node", None), cst.ImportFrom):
                assert index.reads(assignment.node, assignment.name) == len(
                    assignment.references
                ), assignment.name


def _rewrites() -> dict[str, tuple[cst.Module, cst.Module]]:
    """Rewrites of one module as a step makes them (kept nodes are the same objects)."""
    before = cst.parse_module("import os\n\ndef f(x):\n    return g(x + 1)\n\ny = f(2)\n")
    imports, function, call = before.body
    value = call.body[0].value  # type: ignore[attr-defined]
    returned = function.body.body[0]  # type: ignore[attr-defined]
    new = cst.parse_statement("z = 3\n")
    return {
        "kept-and-made": (before, before.with_changes(body=[imports, new, function, call])),
        "kept-twice": (before, before.with_changes(body=[imports, function, call, imports])),
        "kept-and-in-a-made-node": (
            before,
            before.with_changes(body=[*before.body, cst.SimpleStatementLine([cst.Expr(value)])]),
        ),
        "kept-inside-a-rebuilt-one": (
            before,
            before.with_changes(
                body=[
                    imports,
                    function.with_changes(body=cst.IndentedBlock([returned, returned])),
                    call,
                ]
            ),
        ),
        "made-twice": (before, before.with_changes(body=[new, *before.body, new])),
        "unchanged": (before, before),
    }


@pytest.mark.parametrize("name", list(_rewrites()))
def test_repeats_since_a_rewrite_are_the_repeats_of_the_whole_module(name: str) -> None:
    before, after = _rewrites()[name]
    repeats = repeats_a_node(after)
    assert repeats == (name not in ("kept-and-made", "unchanged"))
    assert repeats_a_node_since(after, ModuleIndex(before)) is repeats
