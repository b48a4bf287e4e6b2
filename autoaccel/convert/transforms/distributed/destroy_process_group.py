"""`dist.destroy_process_group()` when the script ends: at the end of the module, or of
its `if __name__ == "__main__":` block, once the models that communicate are freed.

Why they are freed first (torch 2.13, gloo, CPU): a gloo worker thread drops the work of
the last collective after the main thread has moved on, and that work holds Python
objects (the context stashed by `backward()`, the tensors of an FSDP all-gather), so the
thread waits for the GIL. A DDP model or a sharded model left to the exit is freed while
the interpreter finalizes; freeing it releases the GIL, the waiting thread takes it, is
told to exit inside a C++ destructor, and the process aborts ("terminate called without
an active exception", exit -6); `dist.barrier()` first does not prevent it (below).
Freed before the group (`del` of the module's names that hold them, then
`gc.collect()` for the reference cycles), they go while the thread can still take the GIL.
A wrapper kept in an attribute (`self.ddp_model = DDP(...)` in a method of the project's
class) lives as long as the instance: the module-level name that holds the instance goes
too (`del exp`). A CI run of fixtures/facts/base_class/main.py converted to ddp, whose
`exp` kept it, had a rank end with exit 1 and no output after its last epoch (once; not
reproduced here in 90 torchrun runs, 60 of them four at a time, nor 40 forked runs).

Measured, two ranks under torchrun, 2 shared cores: a DDP model at module level, 20 steps,
then destroy: 3 aborts in 16 runs; with `dist.barrier()` first 3 in 40; with `del` and
`gc.collect()` first 0 in 40. An FSDP2 model at module level evaluated after training:
6 in 16; with `del` of the model and its optimizer and `gc.collect()` first, 0 in 30.
linear_exact.py converted `--to ddp` aborted 1 in 40 runs (torchrun) and 1 in 30
(`--launcher spawn`) before.
"""

from __future__ import annotations

from collections.abc import Iterable

import libcst as cst
import libcst.matchers as m

from autoaccel.analysis.program import ClassInfo, Kind, Obj, Program
from autoaccel.analysis.shapes import find, method_calls
from autoaccel.convert.transforms.distributed._base import (
    DISTRIBUTED,
    DistributedStep,
    parse_statements,
)

_INSTANCES = (Kind.MODULE, Kind.INSTANCE)
_MAIN = m.If(test=m.Comparison(left=m.Name("__name__")))


class DestroyProcessGroup(DistributedStep):
    DESCRIPTION = "Free the DDP models, then destroy the process group at the end of the script."
    entry_only = True

    def communicating(self, module: cst.Module) -> set[str]:
        """The names that hold what communicates until it is freed: the DDP wrappers,
        and what holds one (`exp`, whose `train()` sets `self.ddp_model = DDP(...)`)."""
        return self.ddp_wrappers(module) | self.holders(module)

    def communicating_objects(self, program: Program) -> set[Obj]:
        """What communicates until it is freed: the DDP wrappers."""
        return {o for o in program.objects(Kind.MODULE) if o.parallel == "ddp"}

    def holders(self, module: cst.Module) -> set[str]:
        """The module-level names of `module` bound to what communicates, or to an
        instance of a class of the project that holds it in an attribute (or holds an
        instance that does)."""
        program, source = self.script.program, self.script.module
        if program is None or source is None:
            return set()
        attributes: dict[ClassInfo, set[Obj]] = {}
        for (owner, _), values in program.values.items():
            if isinstance(owner, ClassInfo):
                attributes.setdefault(owner, set()).update(values)
        communicating = self.communicating_objects(program)
        holding: set[ClassInfo] = set()

        def holds(values: Iterable[Obj]) -> bool:  # (an instance, not the class itself)
            return any(
                o in communicating or (o.kind in _INSTANCES and o.cls and o.cls.family in holding)
                for o in values
            )

        while True:  # a class holds it when an attribute holds it or a holding instance
            more = {f for f, values in attributes.items() if f not in holding and holds(values)}
            if not more:
                break
            holding |= more
        return {
            name
            for (owner, name), values in program.values.items()
            if owner is source.scope and isinstance(name, str) and holds(values)
        }

    def visit_Module(self, node: cst.Module) -> None:
        if method_calls(node, "destroy_process_group"):
            return
        preceding = list(node.body)
        last = preceding[-1]
        if m.matches(last, _MAIN) and isinstance(last.body, cst.IndentedBlock):  # type: ignore[attr-defined]
            preceding += last.body.body  # type: ignore[attr-defined]
            last = preceding[-1]
        # Only names a statement of this level binds: they are bound when the script
        # ends here, and nothing runs after it (a function's locals go when it returns).
        names = _bound_by(preceding, self.communicating(node))
        release = f"    del {', '.join(names)}\n" if names else ""
        self.after.setdefault(last, []).extend(
            parse_statements(
                f"\nif {DISTRIBUTED}:\n"
                "    # free the models first: left to the exit, they can abort the process\n"
                f"{release}"
                "    gc.collect()\n"
                "    dist.destroy_process_group()\n"
            )
        )
        self.imports.append("import gc")
        self.changed(last, "models freed, then the process group destroyed at the end")


def _bound_by(statements: Iterable[cst.BaseStatement], names: set[str]) -> list[str]:
    """The `names` that one of `statements` itself assigns (not a block inside one), in
    the order they are first bound, less those a later one deletes (`del model`)."""
    bound: list[str] = []
    for statement in statements:
        for small in statement.body if isinstance(statement, cst.SimpleStatementLine) else ():
            if isinstance(small, cst.Del):
                deleted = {t.value for t in find(small.target, cst.Name)}
                bound = [name for name in bound if name not in deleted]
                continue
            targets = (
                [t.target for t in small.targets]
                if isinstance(small, cst.Assign)
                else [small.target] if isinstance(small, cst.AnnAssign) else []
            )
            bound += [
                t.value
                for t in targets
                if isinstance(t, cst.Name) and t.value in names and t.value not in bound
            ]
    return bound
