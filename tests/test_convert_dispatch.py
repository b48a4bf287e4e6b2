"""How a convert step's pass finds its methods and which subtrees it may skip: the same
code as LibCST's full pass, for less work."""

from __future__ import annotations

import dataclasses
import inspect
import typing

import libcst as cst
import libcst.matchers as m

from autoaccel.analysis.index import ModuleIndex, child_fields, descendants
from autoaccel.convert.dispatch import (
    TOKEN_TYPES,
    handled_types,
    has_field_methods,
    method,
    touched_nodes,
)
from autoaccel.convert.log import ConversionLog, ConvertOptions
from autoaccel.convert.transform import Transform, new_context, same_nodes


class RenameA(Transform):
    """`a` -> `b` wherever the name is read or written."""

    def leave_Name(self, original_node: cst.Name, updated_node: cst.Name) -> cst.Name:
        return updated_node.with_changes(value="b") if updated_node.value == "a" else updated_node


class RenameADecorated(Transform):
    """The same through a matcher decorator (LibCST's machinery)."""

    @m.leave(m.Name("a"))
    def rename(self, original_node: cst.Name, updated_node: cst.Name) -> cst.Name:
        return updated_node.with_changes(value="b")


class CountCalls(Transform):
    """Counts the calls it visits."""

    def visit_Module(self, node: cst.Module) -> None:
        self.calls = 0

    def visit_Call(self, node: cst.Call) -> None:
        self.calls += 1


SOURCE = "import os\n\nx = [1, 2, 3]  # numbers\nif x:\n    a = f(a, y=(a + 1))\nprint(a)\n"


def run(step: type[Transform], source: str) -> str:
    context = new_context(ConvertOptions(), ConversionLog())
    return step(context).transform_module(cst.parse_module(source)).code


def _node_types(hint: object) -> set[type]:
    if isinstance(hint, type):
        return {hint} if issubclass(hint, cst.CSTNode) else set()
    return {kind for arg in typing.get_args(hint) for kind in _node_types(arg)}


def test_token_types_cover_every_field_the_index_leaves_out() -> None:
    # A node type found only in such fields has no parent in the module index: a step
    # with a method for it must visit the whole tree.
    left_out: set[type] = set()
    for node_type in vars(cst).values():
        if not (isinstance(node_type, type) and issubclass(node_type, cst.CSTNode)):
            continue
        if inspect.isabstract(node_type) or not dataclasses.is_dataclass(node_type):
            continue
        hints = typing.get_type_hints(node_type)
        children = set(child_fields(node_type))
        for field in dataclasses.fields(node_type):
            if field.name not in children:
                left_out |= _node_types(hints[field.name])
    assert left_out
    assert all(issubclass(kind, TOKEN_TYPES) for kind in left_out), sorted(
        kind.__name__ for kind in left_out if not issubclass(kind, TOKEN_TYPES)
    )


def test_method_finds_the_class_own_and_not_libcst_defaults() -> None:
    assert method(RenameA, "leave_", cst.Name) is RenameA.leave_Name
    assert method(RenameA, "leave_", cst.Call) is None  # LibCST's no-op default
    assert method(RenameA, "visit_", cst.Name, "value") is None


def test_handled_types_are_the_node_types_of_the_class_methods() -> None:
    assert handled_types(RenameA) == {cst.Name}
    assert handled_types(CountCalls) == {cst.Module, cst.Call}


def test_touched_nodes_are_the_handled_nodes_and_their_ancestors() -> None:
    module = cst.parse_module(SOURCE)
    index = ModuleIndex(module)
    touched = touched_nodes(module, index.parents, frozenset({cst.Call}))
    assert touched is not None
    calls = [node for node in touched if isinstance(node, cst.Call)]
    assert sorted(cst.Module([]).code_for_node(call.func) for call in calls) == ["f", "print"]
    assert module in touched
    assert module.body[0] not in touched and module.body[1] not in touched  # no call there
    assert all(call in touched for call in calls)


def test_touched_nodes_give_up_on_token_types() -> None:
    module = cst.parse_module(SOURCE)
    assert touched_nodes(module, ModuleIndex(module).parents, frozenset({cst.Comma})) is None


def test_a_pass_that_skips_subtrees_writes_what_libcst_writes() -> None:
    expected = SOURCE.replace("a", "b")
    assert run(RenameA, SOURCE) == expected
    assert run(RenameADecorated, SOURCE) == expected


def test_a_step_passes_subtrees_without_nodes_it_has_methods_for_through() -> None:
    tree = cst.parse_module("1 + 2\na\n")
    result = RenameA(new_context(ConvertOptions(), ConversionLog())).transform_module(tree)
    assert result.code == "1 + 2\nb\n"
    assert result.body[0] is tree.body[0]  # not visited, so not rebuilt


def test_a_step_with_its_own_hooks_visits_every_node() -> None:
    class EveryName(Transform):
        def on_leave(self, original_node, updated_node):  # type: ignore[no-untyped-def]
            if isinstance(updated_node, cst.Name) and updated_node.value == "a":
                return updated_node.with_changes(value="b")
            return updated_node

    assert handled_types(EveryName) is None
    assert run(EveryName, SOURCE) == SOURCE.replace("a", "b")


def test_a_tree_holding_one_node_twice_is_copied_before_the_pass() -> None:
    # Each occurrence must be a node of its own for parents and edits keyed by node.
    line = cst.parse_statement("a = 1\n")
    tree = cst.Module(body=[line, line])
    seen = []

    class Record(RenameA):
        def visit_Module(self, node: cst.Module) -> None:
            seen.append(node)

    context = new_context(ConvertOptions(), ConversionLog())
    assert Record(context).transform_module(tree).code == "b = 1\nb = 1\n"
    assert seen[0] is not tree
    single = cst.parse_module("a = 1\n")
    Record(new_context(ConvertOptions(), ConversionLog())).transform_module(single)
    assert seen[1] is single  # no copy where each node appears once


def test_a_pass_whose_methods_return_what_they_get_passes_its_input_on() -> None:
    # The pipeline then knows the code is unchanged without writing it out.
    tree = cst.parse_module("x = f(y)\nprint(x)\n")
    assert RenameA(new_context(ConvertOptions(), ConversionLog())).transform_module(tree) is tree
    renamed = RenameA(new_context(ConvertOptions(), ConversionLog())).transform_module(
        cst.parse_module("a = 1\n")
    )
    assert renamed.code == "b = 1\n"


def test_a_step_passes_the_tokens_of_the_nodes_it_rebuilds_through() -> None:
    tree = cst.parse_module("a(x, y)\n")
    result = RenameA(new_context(ConvertOptions(), ConversionLog())).transform_module(tree)
    assert result.code == "b(x, y)\n"
    call = result.body[0].body[0].value  # type: ignore[attr-defined]
    before = tree.body[0].body[0].value  # type: ignore[attr-defined]
    assert call is not before  # rebuilt: it holds the renamed name...
    assert call.args[0].comma is before.args[0].comma  # ...but its tokens are not visited


def test_a_pass_hands_back_the_nodes_it_did_not_change() -> None:
    # Code generation and the next steps tell an unchanged statement by its identity.
    tree = cst.parse_module("def f():\n    return g(x)\na = 1\n")
    result = RenameA(new_context(ConvertOptions(), ConversionLog())).transform_module(tree)
    assert result.code == "def f():\n    return g(x)\nb = 1\n"
    assert result.body[0] is tree.body[0]  # visited (it holds names), nothing renamed
    assert result.body[1] is not tree.body[1]


def test_a_class_whose_own_leave_hook_replaces_nodes_keeps_the_replacements() -> None:
    class RenameAfterTheBase(Transform):
        def on_leave(self, original_node, updated_node):  # type: ignore[no-untyped-def]
            updated = super().on_leave(original_node, updated_node)
            if isinstance(updated, cst.Name) and updated.value == "a":
                return updated.with_changes(value="b")
            return updated

    assert run(RenameAfterTheBase, SOURCE) == SOURCE.replace("a", "b")


def test_field_methods_are_called_where_a_class_has_them() -> None:
    class FuncFields(Transform):
        def visit_Module(self, node: cst.Module) -> None:
            self.fields = 0

        def visit_Call_func(self, node: cst.Call) -> None:
            self.fields += 1

    assert has_field_methods(FuncFields) and not has_field_methods(RenameA)
    step = FuncFields(new_context(ConvertOptions(), ConversionLog()))
    step.transform_module(cst.parse_module(SOURCE))
    assert step.fields == 2  # f(...) and print(...)


class RenameLastA(Transform):
    """Plans in `visit_Module` to rename the last `a` only, and says so (`edited`)."""

    def visit_Module(self, node: cst.Module) -> None:
        self.planned = [n for n in descendants(node) if isinstance(n, cst.Name) and n.value == "a"][
            -1:
        ]
        self.left: list[cst.Name] = []

    def edited(self) -> list[cst.CSTNode]:
        return self.planned

    def leave_Name(self, original_node: cst.Name, updated_node: cst.Name) -> cst.Name:
        self.left.append(original_node)
        return (
            updated_node.with_changes(value="b") if original_node in self.planned else updated_node
        )


def test_a_step_that_plans_its_edits_visits_only_the_way_to_them() -> None:
    tree = cst.parse_module(SOURCE)
    step = RenameLastA(new_context(ConvertOptions(), ConversionLog()))
    result = step.transform_module(tree)
    assert result.code == SOURCE.replace("print(a)", "print(b)")
    assert step.left == step.planned  # not `print`, nor the names of the other lines
    assert same_nodes(result.body[:-1], tree.body[:-1])
