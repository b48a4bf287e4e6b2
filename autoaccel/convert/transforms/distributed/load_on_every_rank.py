"""Every rank loads checkpoints onto its own GPU and, when rank 0 may have just written
the file, only after a barrier.

Rank 0 saves from `cuda:0`; without a map every rank would load onto `cuda:0`.
`map_location={"cuda:0": f"cuda:{LOCAL_RANK}"}` (the PyTorch DDP tutorial's map) moves
only those tensors, so CPU tensors stay on the CPU and a single process loads exactly
as before, whether it loads a state dict or a whole pickled model."""

from __future__ import annotations

import libcst as cst

from autoaccel.analysis.rank_guards import mentions_rank
from autoaccel.analysis.shapes import find, method_calls
from autoaccel.convert.transforms.distributed._base import (
    DIST_IMPORT,
    DISTRIBUTED,
    LOCAL_RANK,
    DistributedStep,
    parse_statements,
    runs_save,
)
from autoaccel.cst_edit import keyword_value, set_keyword

MAP_TO_LOCAL_GPU = '{"cuda:0": f"cuda:{' + LOCAL_RANK + '}"}'


class LoadOnEveryRank(DistributedStep):
    DESCRIPTION = "Load checkpoints with map_location, after a barrier."
    needs = ("load(",)

    def visit_Module(self, node: cst.Module) -> None:
        self.loads: set[cst.Call] = set()
        saved = False
        calls = sorted(find(node, cst.Call), key=self.line_of)
        for call in calls:
            names = self.qualified_names(call.func)
            if "torch.save" in names or runs_save(self.script.program, call):
                saved = True
            elif "torch.load" in names:
                if keyword_value(call, "map_location") is None:
                    self.loads.add(call)
                    self.changed(call, "checkpoint loaded onto this process's GPU (map_location)")
                if saved:
                    self._barrier_before(self._first_statement_of_load(call))

    def _first_statement_of_load(self, call: cst.Call) -> cst.BaseStatement:
        """The load's statement, or the `with` blocks around it (`with open(path) as f:`
        opens the file before the load runs)."""
        statement = self.statement_of(call)
        while isinstance(owner := self.parent(self.parent(statement)), cst.With):  # type: ignore[arg-type]
            statement = owner
        return statement

    def _barrier_before(self, statement: cst.BaseStatement) -> None:
        if any(isinstance(a, cst.If) and mentions_rank(a.test) for a in self.ancestors(statement)):
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
        self.imports.append(DIST_IMPORT)  # (a module the script imports may lack it)
        self.changed(statement, "barrier before loading: every rank waits for rank 0's save")

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.Call:
        if original_node in self.loads:
            return set_keyword(updated_node, "map_location", MAP_TO_LOCAL_GPU)
        return updated_node
