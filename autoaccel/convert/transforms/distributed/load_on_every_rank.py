"""Every rank loads checkpoints onto the CPU (`map_location="cpu"`, not the GPU they were
saved from) and, when rank 0 may have just written the file, only after a barrier."""

from __future__ import annotations

import libcst as cst

from autoaccel.analysis.rank_guards import mentions_rank
from autoaccel.analysis.shapes import find, method_calls
from autoaccel.convert.transforms.distributed._base import (
    DISTRIBUTED,
    DistributedStep,
    parse_statements,
)
from autoaccel.cst_edit import keyword_value, set_keyword



class LoadOnEveryRank(DistributedStep):
    DESCRIPTION = "Load checkpoints with map_location, after a barrier."
    needs = ("load(",)

    def visit_Module(self, node: cst.Module) -> None:
        self.loads: set[cst.Call] = set()
        saved = False
        calls = sorted(find(node, cst.Call), key=self.line_of)
        for call in calls:
            names = self.qualified_names(call.func)
            if "torch.save" in names:
                saved = True
            elif "torch.load" in names:
                if keyword_value(call, "map_location") is None:
                    self.loads.add(call)
                    self.changed(call, 'checkpoint loaded with `map_location="cpu"`')
                if saved:
                    self._barrier_before(self.statement_of(call))

    def _barrier_before(self, statement: cst.BaseStatement) -> None:
        if any(
            isinstance(a, cst.If) and mentions_rank(a.test) for a in self.ancestors(statement)
        ):
            return  # a barrier that only some ranks reach would hang the others
        block = self.parent(statement)
        siblings = list(block.body)  # type: ignore[union-attr]
        index = siblings.index(statement)
        previous = [siblings[index - 1]] if index else []
        if any(method_calls(s, "barrier") for s in [*previous, *self.before.get(statement, [])]):
            return
        self.before.setdefault(statement, []).extend(
            parse_statements(
                f"if {DISTRIBUTED}:\n    dist.barrier()  # rank 0 may still be writing it\n"
            )
        )
        self.changed(statement, "barrier before loading: every rank waits for rank 0's save")

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.Call:
        if original_node in self.loads:
            return set_keyword(updated_node, "map_location", '"cpu"')
        return updated_node
