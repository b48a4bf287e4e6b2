"""A model that `ModelWithLoss` replicates loses the script's own `nn.DataParallel`.

    model = nn.DataParallel(model)                  (removed)
    model.module.state_dict()                 ->    model.state_dict()
    if isinstance(model, nn.DataParallel): ...      (only the `else` branch is kept)
    model.load_state_dict(state)                    (`module.` prefix stripped first)

Its name then points at the bare model again, as in a script that never used DataParallel;
the replication happens once, inside `ModelWithLoss`, so the loss is computed on every GPU.
"""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from autoaccel.analysis.names import name_key
from autoaccel.analysis.script_model import DATA_PARALLEL, DISTRIBUTED_DATA_PARALLEL
from autoaccel.analysis.shapes import find, name_calls, tuple_items
from autoaccel.convert.transform import Transform
from autoaccel.convert.transforms.checkpoint_keys import loads_into, strip_prefix
from autoaccel.convert.transforms.data_parallel.wraps import (
    GENERAL_CLASS,
    WRAPPER_CLASS,
    aliases,
    data_parallel_wraps,
    replicated_models,
    single_assign,
)

_WRAPPERS = frozenset({DATA_PARALLEL, DISTRIBUTED_DATA_PARALLEL})


class UnwrapDataParallel(Transform):
    DESCRIPTION = (
        f"Remove the script's own nn.DataParallel around a model that {WRAPPER_CLASS} replicates."
    )
    code = "ACC402"

    def visit_Module(self, node: cst.Module) -> None:
        replicated = replicated_models(node)
        # the wrapper class this module's steps replicate with (the note names it)
        wrapper = GENERAL_CLASS if name_calls(node, GENERAL_CLASS) else WRAPPER_CLASS
        self.unwrapped: set[str] = set()  # names that held a DataParallel and now a bare model
        self.calls: set[cst.CSTNode] = (
            set()
        )  # `nn.DataParallel(...)` calls to replace by their module
        self.statements: set[cst.CSTNode] = set()  # `model = nn.DataParallel(model)` lines to drop
        self.loads: set[cst.Call] = set()  # `model.load_state_dict(...)` of an unwrapped model
        for wrap in data_parallel_wraps(self, node):
            names = aliases({wrap.key}, node)
            if not names & replicated or not wrap.only_wraps:
                continue
            self.unwrapped |= names
            module = wrap.call.args[0].value
            if single_assign(wrap.statement)[1] is wrap.call and name_key(module) == wrap.key:
                self.statements.add(wrap.statement)
            else:
                self.calls.add(wrap.call)
            self.changed(
                wrap.statement,
                f"`{wrap.key}` stays the bare model: `{wrapper}` replicates it with"
                " `nn.DataParallel` together with its loss",
            )

    def leave_SimpleStatementLine(
        self, original_node: cst.SimpleStatementLine, updated_node: cst.SimpleStatementLine
    ) -> cst.BaseStatement | cst.FlattenSentinel[cst.BaseStatement] | cst.RemovalSentinel:
        if original_node in self.statements:
            return cst.RemovalSentinel.REMOVE
        load = next((c for c in find(original_node, cst.Call) if c in self.loads), None)
        if load is None:
            return updated_node
        before = strip_prefix(load)[0]
        before[0] = before[0].with_changes(leading_lines=updated_node.leading_lines)
        return cst.FlattenSentinel([*before, updated_node.with_changes(leading_lines=[])])

    def visit_Call(self, node: cst.Call) -> None:
        if loads_into(node, self.unwrapped):
            self.loads.add(node)
            self.changed(
                node,
                "checkpoints saved under nn.DataParallel still load: `module.` prefix stripped",
            )

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        if original_node in self.calls:
            return updated_node.args[0].value
        if original_node in self.loads:
            return strip_prefix(updated_node)[1]
        return updated_node

    def leave_Attribute(
        self, original_node: cst.Attribute, updated_node: cst.Attribute
    ) -> cst.BaseExpression:
        key = name_key(original_node.value)
        if original_node.attr.value != "module" or key not in self.unwrapped:
            return updated_node
        self.changed(original_node, f"`{key}.module` is `{key}`: it is the bare model now")
        return updated_node.value

    def leave_If(
        self, original_node: cst.If, updated_node: cst.If
    ) -> cst.BaseStatement | cst.FlattenSentinel[cst.BaseStatement] | cst.RemovalSentinel:
        """`if isinstance(model, nn.DataParallel): ... else: ...` -> the branch that now runs."""
        if not updated_node.body.body and updated_node.orelse is None:
            return cst.RemovalSentinel.REMOVE  # it only wrapped the model
        test, negated = original_node.test, False
        if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
            test, negated = test.expression, True
        if not self._tests_for_wrapper(test) or isinstance(updated_node.orelse, cst.If):
            return updated_node
        if isinstance(self.parent(original_node), cst.If):
            return updated_node  # an `elif`: the chain stays as written
        self.changed(original_node, f"`{cst.Module([]).code_for_node(test)}` is always false now")
        if negated:
            kept = list(updated_node.body.body)
        elif updated_node.orelse is not None:
            kept = list(updated_node.orelse.body.body)
        else:
            return cst.RemovalSentinel.REMOVE
        kept[0] = kept[0].with_changes(
            leading_lines=[*updated_node.leading_lines, *kept[0].leading_lines]
        )
        return cst.FlattenSentinel(kept)

    def _tests_for_wrapper(self, test: cst.BaseExpression) -> bool:
        """`isinstance(model, nn.DataParallel)` (or a tuple of parallel wrappers)."""
        if not (
            m.matches(test, m.Call(func=m.Name("isinstance"), args=[m.Arg(), m.Arg()]))
            and name_key(test.args[0].value) in self.unwrapped  # type: ignore[attr-defined]
        ):
            return False
        kinds = test.args[1].value  # type: ignore[attr-defined]
        return all(self.qualified_names(e) & _WRAPPERS for e in tuple_items(kinds))
