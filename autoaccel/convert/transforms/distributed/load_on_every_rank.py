"""Every rank loads checkpoints onto its own GPU, and reads a file that rank 0 may have
just written only after a barrier.

Rank 0 saves from `cuda:0`; without a map every rank would load onto `cuda:0`.
`map_location={"cuda:0": f"cuda:{LOCAL_RANK}"}` (the PyTorch DDP tutorial's map) moves
only those tensors, so CPU tensors stay on the CPU and a single process loads exactly
as before, whether it loads a state dict or a whole pickled model.

A read (`open(path)`, `json.load`, `torch.load`, `np.load`, `pd.read_csv`, or a call of
a function of the project that reads: sample.py's `load_meta(run_dir)`) waits for rank 0
when a write runs before it in its function: a `torch.save`, or a write under a rank
test (`if RANK == 0:`), in a statement before it, in its block or one around it, itself
or through the project's functions it calls, or anywhere in a loop around it (an earlier
pass). The paths are not compared: a read after such a write is enough. The barrier
goes where every rank reaches it: not under a rank test, and refused in a `while` loop or
a loop that may `break` (the ranks may run it a different number of times)."""

from __future__ import annotations

import libcst as cst

from autoaccel.analysis.index import ModuleIndex
from autoaccel.analysis.rank_guards import rank_guarded
from autoaccel.analysis.shapes import find, is_attribute, method_calls
from autoaccel.analysis.side_effects import OPENS, EffectKind, find_side_effects, opening_mode
from autoaccel.convert.transforms.distributed._base import (
    DIST_IMPORT,
    DISTRIBUTED,
    LOCAL_RANK,
    DistributedStep,
    parse_statements,
    runs_a_call,
)
from autoaccel.cst_edit import keyword_value, set_keyword

MAP_TO_LOCAL_GPU = '{"cuda:0": f"cuda:{' + LOCAL_RANK + '}"}'
# Calls that read a file, besides `open(...)` in a reading mode.
READERS = frozenset(
    {
        "torch.load",
        "json.load",
        "pickle.load",
        "numpy.load",
        "numpy.loadtxt",
        "pandas.read_csv",
        "pandas.read_json",
        "pandas.read_pickle",
        "pandas.read_parquet",
    }
)
# `Path.read_text()`: methods that read whatever path they are called on.
_READING_METHODS = frozenset({"read_text", "read_bytes"})
_WRITES = (EffectKind.CHECKPOINT, EffectKind.FILE_WRITE)


def reads_file(call: cst.Call, index: ModuleIndex) -> bool:
    """Whether `call` reads a file."""
    names = index.qualified_names(call.func)
    if names & OPENS:
        mode = opening_mode(call)
        return mode is None or (
            isinstance(mode, cst.SimpleString) and "r" in str(mode.evaluated_value)
        )
    return bool(names & READERS) or (not names and is_attribute(call.func, *_READING_METHODS))


class LoadOnEveryRank(DistributedStep):
    DESCRIPTION = "Load checkpoints with map_location; read rank 0's files after a barrier."

    def visit_Module(self, node: cst.Module) -> None:
        self.loads: set[cst.Call] = set()
        self._rank_zero_writes: dict[cst.Module, set[cst.Call]] = {}
        self._writing: dict[cst.Call, bool] = {}
        self._refused: set[cst.BaseStatement] = set()
        for call in sorted(find(node, cst.Call), key=self.line_of):
            if "torch.load" in self.qualified_names(call.func):
                if keyword_value(call, "map_location") is None:
                    self.loads.add(call)
                    self.changed(call, "checkpoint loaded onto this process's GPU (map_location)")
            if reads_file(call, self.script.index) or runs_a_call(  # type: ignore[arg-type]
                self.script.program, call, lambda c, module: reads_file(c, module.index)
            ):
                self._barrier_before(self._first_statement_of_load(call))

    def _first_statement_of_load(self, call: cst.Call) -> cst.BaseStatement:
        """The load's statement, or the `with` blocks around it (`with open(path) as f:`
        opens the file before the load runs)."""
        statement = self.statement_of(call)
        while isinstance(owner := self.parent(self.parent(statement)), cst.With):  # type: ignore[arg-type]
            statement = owner
        return statement

    # -- writes before the read -------------------------------------------------------
    def _writes(self, node: cst.CSTNode) -> bool:
        """Whether `node` saves a checkpoint or writes on rank 0 only, itself or through
        the project's functions it calls."""
        for call in find(node, cst.Call):
            if call not in self._writing:
                self._writing[call] = self._write(
                    call, self.script.index  # type: ignore[arg-type]
                ) or runs_a_call(self.script.program, call, lambda c, m: self._write(c, m.index))
            if self._writing[call]:
                return True
        return False

    def _write(self, call: cst.Call, index: ModuleIndex) -> bool:
        if "torch.save" in index.qualified_names(call.func):
            return True
        if index.module not in self._rank_zero_writes:
            self._rank_zero_writes[index.module] = {
                e.call  # type: ignore[misc]
                for e in find_side_effects(index.module, index).effects
                if e.guarded and e.kind in _WRITES
            }
        return call in self._rank_zero_writes[index.module]

    def _after_a_write(self, statement: cst.BaseStatement) -> bool:
        """Whether a write (`_writes`) runs before `statement` in its function: in a
        statement before it, in its block or one around it, or in a loop around it."""
        child: cst.CSTNode = statement
        for ancestor in self.ancestors(statement):
            if isinstance(ancestor, (cst.For, cst.While)) and self._writes(ancestor.body):
                return True
            if isinstance(ancestor, (cst.IndentedBlock, cst.Module)):
                earlier = ancestor.body[: list(ancestor.body).index(child)]  # type: ignore[arg-type]
                definitions = (cst.FunctionDef, cst.ClassDef)  # not run where they stand
                if any(self._writes(s) for s in earlier if not isinstance(s, definitions)):
                    return True
            if isinstance(ancestor, (cst.FunctionDef, cst.ClassDef)):
                return False
            child = ancestor
        return False

    def _uneven_loop(self, statement: cst.BaseStatement) -> cst.For | cst.While | None:
        """The loop around `statement` in its function that ranks may run a different
        number of times: a `while` loop, or a loop with a `break` of its own."""
        for ancestor in self.ancestors(statement):
            if isinstance(ancestor, (cst.FunctionDef, cst.ClassDef)):
                return None
            if isinstance(ancestor, cst.While) or (
                isinstance(ancestor, cst.For)
                and any(self._loop_of(b) is ancestor for b in find(ancestor.body, cst.Break))
            ):
                return ancestor
        return None

    def _loop_of(self, node: cst.CSTNode) -> cst.CSTNode | None:
        return next((a for a in self.ancestors(node) if isinstance(a, (cst.For, cst.While))), None)

    # -- the barrier ------------------------------------------------------------------
    def _barrier_before(self, statement: cst.BaseStatement) -> None:
        if rank_guarded(statement, self.ancestors(statement)):
            return  # rank 0 reads what it wrote itself; a barrier there would hang the others
        if not self._after_a_write(statement):
            return
        block = self.parent(statement)
        siblings = list(block.body)  # type: ignore[union-attr]
        index = siblings.index(statement)
        previous = [siblings[index - 1]] if index else []
        if any(method_calls(s, "barrier") for s in [*previous, *self.before.get(statement, [])]):
            return
        if self._uneven_loop(statement) is not None:
            if statement in self._refused:
                return
            self._refused.add(statement)
            self.skipped(
                "dist.barrier",
                "this reads a file that rank 0 alone may just have written, in a loop the"
                " processes may run a different number of times: a barrier here could hang;"
                " wait for rank 0 (or read on rank 0 and broadcast) by hand",
                statement,
                wrong=True,
            )
            return
        self.before.setdefault(statement, []).extend(
            parse_statements(
                f"if {DISTRIBUTED}:\n    dist.barrier()  # rank 0 may still be writing it\n"
            )
        )
        self.imports.append(DIST_IMPORT)  # (a module the script imports may lack it)
        self.changed(statement, "barrier before reading: every rank waits for rank 0's write")

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.Call:
        if original_node in self.loads:
            return set_keyword(updated_node, "map_location", MAP_TO_LOCAL_GPU)
        return updated_node
