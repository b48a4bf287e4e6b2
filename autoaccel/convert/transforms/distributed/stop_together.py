"""A training loop that stops on a value each process computes from its own data
(`if loss < 1e-3: break`) stops on every process at the same step.

Under DDP the processes see different values and would stop at different steps, and
those still training would wait forever in their next `backward()`. The condition goes
through `on_any_rank()`, which all-reduces it (MAX) over the processes: when it holds on
any process, every process takes the branch. Run with plain `python`, it is the
condition itself.

So does an epoch loop that stops on the state of what it calls or computes each epoch
(LTSF-Linear's `early_stopping(vali_loss, ...)`, then `if early_stopping.early_stop:
break`): the losses each process averages differ, and a process that left the loop alone
left the other waiting in its next DDP step (a hang of the seventh unseen set).
"""

from __future__ import annotations

import libcst as cst

from autoaccel.analysis.names import name_key
from autoaccel.analysis.rank_guards import rank_guarded
from autoaccel.analysis.shapes import find, method_calls
from autoaccel.convert.transforms.distributed._base import DIST_IMPORT, DISTRIBUTED, DistributedStep

HELPER = "on_any_rank"
# The helpers that make a condition the same on every process: this step's, the guard of
# steps on each process's own data (`shard_train_loader.py`), rank 0's decision over a
# gathering (`fully_sharded/gather_state_dicts.py`).
EVERY_PROCESS = "every_process"
FIRST_PROCESS_DECIDES = "first_process_decides"
_AGREEMENTS = frozenset({HELPER, EVERY_PROCESS, FIRST_PROCESS_DECIDES})


def agreement_helper(name: str, holds: str, collective: str) -> str:
    """The code of `name(condition)`: `condition` as a 0/1 tensor through `collective`
    (an all-reduce with MAX: it holds on any process; MIN: on every one; a broadcast
    from rank 0), so that every process takes the same branch, which `holds` says; the
    condition itself under plain `python`."""
    return f'''
def {name}(condition):
    """Whether `condition` holds on {holds}."""
    if not {DISTRIBUTED}:
        return condition
    flag = torch.tensor(float(bool(condition)))
    {collective}
    return bool(flag.item())
'''


_HELPER_CODE = agreement_helper(
    HELPER,
    "any process: then every process takes the branch",
    "dist.all_reduce(flag, op=dist.ReduceOp.MAX)",
)


class StopTogether(DistributedStep):
    DESCRIPTION = "Make training loops that stop on a loss stop together on every process."
    needs = ("break",)

    def visit_Module(self, node: cst.Module) -> None:
        self.tests: set[cst.BaseExpression] = set()
        for loop in self.train_loops():
            self._agree(loop, _loss_values(loop), "step", loop)
            epochs = next(
                (
                    a
                    for a in self.ancestors(loop)
                    if isinstance(a, (cst.For, cst.While, cst.FunctionDef))
                ),
                None,
            )
            if isinstance(epochs, (cst.For, cst.While)):
                self._agree(epochs, _changed_each_pass(epochs, loop), "epoch", loop)
        if self.tests:
            self.define_helper(node, HELPER, _HELPER_CODE)
            self.imports.append(DIST_IMPORT)

    def _agree(
        self, loop: cst.For | cst.While, per_process: set[str], unit: str, steps: cst.CSTNode
    ) -> None:
        """Put the tests of `loop`'s breaks that read `per_process` through `HELPER` (an
        epoch `loop`: those outside its step loop `steps`)."""
        for branch in find(loop.body, cst.If):
            if agreed(branch.test) or not find(branch.body, cst.Break) or branch.test in self.tests:
                continue
            if unit == "epoch" and any(a is steps for a in self.ancestors(branch)):
                continue
            if rank_guarded(branch, self.ancestors(branch)):
                continue  # (one process runs it: a collective there would wait forever)
            if _mentions(branch.test, per_process):
                self.tests.add(branch.test)
                self.changed(
                    branch,
                    f"the loop stops on a value each process computes from its own data:"
                    f" `{HELPER}()` all-reduces the condition, so every process stops at"
                    f" the same {unit}",
                )

    def leave_If(self, original_node: cst.If, updated_node: cst.If) -> cst.If:
        if original_node.test not in self.tests:
            return updated_node
        return updated_node.with_changes(
            test=cst.Call(cst.Name(HELPER), [cst.Arg(updated_node.test)])
        )


def agreed(test: cst.BaseExpression) -> bool:
    """`on_any_rank(...)`, `every_process(...)`, `first_process_decides(...)`: a condition
    already the same on every process."""
    return (
        isinstance(test, cst.Call)
        and isinstance(test.func, cst.Name)
        and test.func.value in _AGREEMENTS
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
    from them in the loop (`loss = output.item()`) or set under a test of them (DGI's
    `cnt_wait += 1` in the `else:` of `if loss < best:`)."""
    found = {key for c in method_calls(loop, "backward") if (key := name_key(c.func.value))}  # type: ignore[attr-defined]
    assignments = find(loop, cst.Assign)
    branches = find(loop, cst.If)
    grew = True
    while grew:
        size = len(found)
        for assign in assignments:
            if _mentions(assign.value, found):
                found |= {key for t in assign.targets if (key := name_key(t.target))}
        for branch in branches:
            if _mentions(branch.test, found):
                set_here: list[cst.AssignTarget | cst.AugAssign] = find(
                    branch, (cst.AssignTarget, cst.AugAssign)
                )
                found |= {key for t in set_here if (key := name_key(t.target))}
        grew = len(found) > size
    return found


def _changed_each_pass(loop: cst.For | cst.While, steps: cst.CSTNode) -> set[str]:
    """The names an epoch loop's body binds, and those whose objects it calls or calls a
    method of (`early_stopping(vali_loss)`, `stopper.step(loss)`), outside its step loop
    `steps` (whose own breaks agree already): their state may differ between processes."""
    inner = {id(node) for node in find(steps, (cst.AssignTarget, cst.Call))}
    targets = [t for t in find(loop.body, cst.AssignTarget) if id(t) not in inner]
    calls = [c for c in find(loop.body, cst.Call) if id(c) not in inner]
    bound = {key for t in targets if (key := name_key(t.target))}
    called = {
        key
        for call in calls
        if (key := name_key(call.func.value if isinstance(call.func, cst.Attribute) else call.func))
    }
    return bound | called
