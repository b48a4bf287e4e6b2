"""A training total printed after a loop whose batches are shared by rounds is summed
over every process first.

`total += loss.item()` in a loop over batches each process takes its share of
(`ShardBatchRounds`: whole batches, 1/WORLD_SIZE of the steps), then `print(f"epoch
{epoch} loss {total:.3f}")`: rank 0 printed 1/WORLD_SIZE of the original's total. Right
before the print, which every process reaches (a statement after the loop, in its
block), the total is added up over the processes into a name of its own
(`total_all_processes = summed_over_processes(total)`), and the print reads that; the
script's own `total` keeps what it was. An average (`total / len(batches)`) is its own
process's, and is left as it is. (Where a DataLoader's batch is split instead, each
process takes as many steps as the original, and its total of per-step means is
comparable as it is.)
"""

from __future__ import annotations

import libcst as cst

from autoaccel.analysis.names import name_key
from autoaccel.analysis.shapes import find
from autoaccel.analysis.side_effects import PRINTS
from autoaccel.convert.transforms.distributed._base import (
    DIST_IMPORT,
    DistributedStep,
    fresh_name,
    number_over_processes,
    parse_statements,
)
from autoaccel.convert.transforms.distributed.shard_batch_rounds import shared_loops
from autoaccel.convert.transforms.inserted_names import variable_names

HELPER = "summed_over_processes"
_HELPER_CODE = number_over_processes(
    HELPER, "`value`, a number this process added up, added up over every process.", False
)


class SumPrintedTotals(DistributedStep):
    DESCRIPTION = "Print training totals added up over every process."
    needs = ("+=",)

    def visit_Module(self, node: cst.Module) -> None:
        self.reads: dict[cst.BaseExpression, str] = {}  # a total in a print -> its global name
        assigned = {name_key(t.target) for t in find(node, cst.AssignTarget)}
        taken = variable_names(node) | {name for name in assigned if name is not None}
        for loop in (step.node for step in shared_loops(self.script)):
            block = self.parent(loop)
            if not isinstance(block, (cst.IndentedBlock, cst.Module)):
                continue
            after = list(block.body)[list(block.body).index(loop) + 1 :]
            for statement in after:
                for total, reads in self._printed_totals(statement).items():
                    name = fresh_name(f"{total.split('.')[-1]}_all_processes", taken)
                    taken.add(name)
                    code = f"{name} = {HELPER}({total})\n"
                    self.before.setdefault(statement, []).extend(parse_statements(code))
                    self.reads.update(dict.fromkeys(reads, name))
                    self.changed(
                        statement,
                        f"`{total}` printed added up over every process (`{name}`): each"
                        " process sums its own share of the batches",
                    )
        if self.reads:
            self.define_helper(node, HELPER, _HELPER_CODE)
            self.imports.append(DIST_IMPORT)
            self.needs_torch = True

    def _printed_totals(self, statement: cst.CSTNode) -> dict[str, list[cst.BaseExpression]]:
        """The training sums a print statement reads as they are (not divided: an
        average), each with its reads there."""
        line = statement.body[0] if isinstance(statement, cst.SimpleStatementLine) else None
        call = line.value if isinstance(line, cst.Expr) else None
        if not isinstance(call, cst.Call) or not self.qualified_names(call.func) & PRINTS:
            return {}
        divided = {
            node
            for operation in find(call, cst.BinaryOperation)
            if isinstance(operation.operator, (cst.Divide, cst.FloorDivide))
            for node in find(operation, (cst.Name, cst.Attribute))
        }
        found: dict[str, list[cst.BaseExpression]] = {}
        for read in find(call, (cst.Name, cst.Attribute)):
            key = name_key(read)
            if (
                key in self._training_sums
                and read not in divided
                and not self._inside_attribute(read)
            ):
                found.setdefault(key, []).append(read)
        return found

    def _inside_attribute(self, node: cst.CSTNode) -> bool:
        """`total` of `self.total`, or the `attr` of an attribute: not a read of its own."""
        parent = self.parent(node)
        return isinstance(parent, cst.Attribute)

    def edited(self) -> list[cst.CSTNode]:
        return [*self.planned_statements(), *self.reads]

    def leave_Name(self, original_node: cst.Name, updated_node: cst.Name) -> cst.BaseExpression:
        name = self.reads.get(original_node)
        return updated_node if name is None else cst.Name(name)

    def leave_Attribute(
        self, original_node: cst.Attribute, updated_node: cst.Attribute
    ) -> cst.BaseExpression:
        name = self.reads.get(original_node)
        return updated_node if name is None else cst.Name(name)
