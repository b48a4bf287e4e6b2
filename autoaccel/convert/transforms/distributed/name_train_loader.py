"""A training DataLoader passed straight to a call gets a statement and a name of its own.

`Trainer(model, DataLoader(train_set, batch_size=16, shuffle=True)).train()` becomes
`train_loader = DataLoader(...)` and `Trainer(model, train_loader).train()`: the later
steps then shard it as any assigned loader (`ShardTrainLoader` gives it its
DistributedSampler, `SetSamplerEpoch` its `set_epoch`). Only where it is built whenever its
statement runs: a loader in a lambda, a comprehension, a condition or a compound
statement's header stays where it is.
"""

from __future__ import annotations

import itertools

import libcst as cst
import libcst.matchers as m

from autoaccel.convert.transforms.distributed._base import DistributedStep, fresh_name
from autoaccel.convert.transforms.distributed.shard_train_loader import train_loader_calls
from autoaccel.convert.transforms.inserted_names import variable_names

# What the loader's call may sit in to run whenever its statement runs, and no earlier.
_EAGER = (cst.Arg, cst.Call, cst.Attribute, cst.Expr, cst.Assign, cst.Return)


class NameTrainLoader(DistributedStep):
    DESCRIPTION = "Build a training DataLoader passed straight to a call in a statement of its own."

    def visit_Module(self, node: cst.Module) -> None:
        self.names: dict[cst.Call, tuple[str, cst.BaseStatement]] = {}
        bound = variable_names(node)
        for call in sorted(train_loader_calls(self.script), key=self.line_of):
            statement = self.statement_of(call)
            if self.shards(node, call) or not self._passed_inline(call, statement):
                continue
            name = fresh_name("train_loader", bound)
            bound.add(name)
            self.names[call] = (name, statement)
            self.before.setdefault(statement, [])  # filled by `leave_Call`: the call rewritten
            self.changed(call, f"training DataLoader built first, as `{name}`, to be sharded")

    def _passed_inline(self, call: cst.Call, statement: cst.BaseStatement) -> bool:
        """Whether `call` is an argument of a call that its one-line statement makes
        whenever it runs (`train(model, DataLoader(...), opt)`)."""
        if not isinstance(self.parent(call), cst.Arg) or not m.matches(
            statement, m.SimpleStatementLine(body=[m.DoNotCare()])
        ):
            return False
        ancestors = itertools.takewhile(lambda a: a is not statement, self.ancestors(call))
        return all(isinstance(a, _EAGER) for a in ancestors)

    def edited(self) -> list[cst.CSTNode]:
        return [*self.planned_statements(), *self.names]

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        if original_node not in self.names:
            return updated_node
        name, statement = self.names[original_node]
        assign = cst.Assign([cst.AssignTarget(cst.Name(name))], updated_node)
        self.before[statement].append(cst.SimpleStatementLine([assign]))
        return cst.Name(name)
