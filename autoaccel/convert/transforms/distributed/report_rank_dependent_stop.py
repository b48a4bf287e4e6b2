"""A training loop that stops on a value each process computes from its own data
(`if loss < 1e-3: break`): under DDP the processes see different values and stop at
different steps, and those still training wait forever in their next `backward()`.
Reported with its line, not rewritten: which value all processes should agree on
(an average over processes, rank 0's value) is the author's choice."""

from __future__ import annotations

import libcst as cst

from autoaccel.analysis.names import name_key
from autoaccel.analysis.shapes import find, method_calls
from autoaccel.convert.transforms.distributed._base import DistributedStep


class ReportRankDependentStop(DistributedStep):
    DESCRIPTION = "Report training loops that stop on a value of one process."
    reports_only = True
    needs = ("break",)

    def visit_Module(self, node: cst.Module) -> None:
        for loop in self.train_loops():
            per_process = _loss_values(loop)
            for test in find(loop.body, cst.If):
                if _mentions(test.test, per_process) and find(test.body, cst.Break):
                    self.skipped(
                        "stopping together",
                        "this loop stops on a loss each process computes from its own data,"
                        " so processes stop at different steps and the others hang in"
                        " backward(); stop on a value all processes share (e.g. the loss"
                        " averaged with dist.all_reduce) by hand",
                        test,
                        wrong=True,
                    )


def _mentions(node: cst.CSTNode, names: set[str]) -> bool:
    """Whether `node` reads one of `names` (`loss`, `loss.item()`, `self.loss`)."""
    return any(
        key == name or key.startswith(name + ".")
        for n in find(node, (cst.Name, cst.Attribute))
        if (key := name_key(n))
        for name in names
    )


def _loss_values(loop: cst.CSTNode) -> set[str]:
    """Names of the tensors whose `.backward()` the loop calls, and of values computed
    from them in the loop (`loss = output.item()`)."""
    found = {key for c in method_calls(loop, "backward") if (key := name_key(c.func.value))}  # type: ignore[attr-defined]
    assignments = find(loop, cst.Assign)
    grew = True
    while grew:
        grew = False
        for assign in assignments:
            if not _mentions(assign.value, found):
                continue
            for target in assign.targets:
                key = name_key(target.target)
                if key and key not in found:
                    found.add(key)
                    grew = True
    return found
