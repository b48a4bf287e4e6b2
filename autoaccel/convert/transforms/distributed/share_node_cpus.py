"""DataLoader workers share the node's CPUs among the processes torchrun starts on it.

The single-process fix gives a loader `min(8, os.cpu_count() or 1)` workers; under DDP
every process would start that many (8 GPUs: 64 workers per loader on one node). Each
process takes its share of the CPUs instead:

    num_workers=min(8, os.cpu_count() or 1)  ->  num_workers=min(8, CPUS_PER_PROCESS)

with `CPUS_PER_PROCESS` (at least 1, which `persistent_workers=True` needs) defined in
torchrun's `LOCAL_WORLD_SIZE`, after the set-up block. Plain `python` gets all the CPUs.
"""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from autoaccel.analysis.shapes import find
from autoaccel.convert.transforms.distributed._base import (
    DISTRIBUTED,
    DistributedStep,
    parse_statements,
)

CPUS_PER_PROCESS = "CPUS_PER_PROCESS"
_DEFINITION = f"""# DataLoader workers: the processes on this node share its CPUs.
LOCAL_WORLD_SIZE = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
{CPUS_PER_PROCESS} = max(1, (os.cpu_count() or 1) // LOCAL_WORLD_SIZE)
"""
# `min(8, os.cpu_count() or 1)`, the worker count ACC101's fix writes.
_WHOLE_NODE = m.Call(
    func=m.Name("min"),
    args=[
        m.Arg(m.Integer("8"), keyword=None),
        m.Arg(
            m.BooleanOperation(
                left=m.Call(func=m.Attribute(m.Name("os"), m.Name("cpu_count")), args=[]),
                operator=m.Or(),
                right=m.Integer("1"),
            ),
            keyword=None,
        ),
    ],
)
_SETUP = m.If(test=m.Name(DISTRIBUTED))


class ShareNodeCpus(DistributedStep):
    DESCRIPTION = "Divide the node's CPUs among its processes for DataLoader workers."
    needs = ("os.cpu_count",)

    def visit_Module(self, node: cst.Module) -> None:
        self.shared: set[cst.Call] = set()
        # the set-up block's `if DISTRIBUTED: ... init_process_group(...)`
        self.setup = next((s for s in node.body if m.matches(s, _SETUP)), None)
        if self.setup is not None:
            for call in find(node, cst.Call):
                self._share(call)

    def _share(self, call: cst.Call) -> None:
        if not m.matches(call, _WHOLE_NODE):
            return
        # the builtin `min` and `os.cpu_count`, as the fix writes them (not names of the script's)
        count = call.args[1].value.left.func  # type: ignore[attr-defined]
        if "builtins.min" in self.qualified_names(
            call.func
        ) and "os.cpu_count" in self.qualified_names(count):
            self.shared.add(call)
            self.changed(
                call,
                f"DataLoader workers per process: the node's CPUs divided among its"
                f" processes (`{CPUS_PER_PROCESS}`, from torchrun's LOCAL_WORLD_SIZE)",
            )

    def edited(self) -> list[cst.CSTNode]:
        return [*self.planned_statements(), *self.shared]

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.Call:
        if original_node not in self.shared:
            return updated_node
        share = updated_node.args[1].with_changes(value=cst.Name(CPUS_PER_PROCESS))
        return updated_node.with_changes(args=[updated_node.args[0], share])

    def leave_Module(self, original_node: cst.Module, updated_node: cst.Module) -> cst.Module:
        if self.shared and self.setup is not None:
            self.after.setdefault(self.setup, []).extend(parse_statements("\n" + _DEFINITION))
        return super().leave_Module(original_node, updated_node)
