"""An evaluation whose metrics are sums (a summed loss, a count of correct answers) runs
on a share of the set on each process, and the sums are added up over the processes.

pytorch/examples' mnist evaluates with `test_loss += F.nll_loss(..., reduction="sum")
.item()` and `correct += pred.eq(target).sum().item()`, then divides by the size of the
set: each process can sum over every WORLD_SIZE-th sample (`sampler=range(RANK, n,
WORLD_SIZE)`: no padding, so no sample counts twice), and `all_reduce_sums()` then gives
every process the sums over the whole set, so the printed numbers are the original's
(float64 sums: equal up to the order of the additions). An evaluation that keeps anything
else (predictions in a list, a mean of batch means, a `break`) stays on the whole set on
every process, as before.
"""

from __future__ import annotations

import libcst as cst

from autoaccel.analysis.loss_reduction import (
    LossReductions,
    Reduction,
    assigned_values,
    is_batch_size,
)
from autoaccel.analysis.names import name_key
from autoaccel.analysis.rank_guards import mentions_rank
from autoaccel.analysis.script_model import Missing
from autoaccel.analysis.shapes import find, is_false, is_method_call
from autoaccel.analysis.side_effects import PRINTS, find_side_effects
from autoaccel.analysis.training import LoopRole, StepLoop
from autoaccel.convert.transforms.distributed._base import (
    DIST_IMPORT,
    DISTRIBUTED,
    RANK,
    WORLD_SIZE,
    DistributedStep,
    parse_statements,
)
from autoaccel.cst_edit import keyword_value, set_keyword

HELPER = "all_reduce_sums"
_HELPER_CODE = f'''
def {HELPER}(*sums):
    """The sums over every process of `sums` (each process summed its share of a set)."""
    totals = torch.tensor(sums, dtype=torch.float64)
    dist.all_reduce(totals)
    return [type(value)(total) for value, total in zip(sums, totals.tolist())]
'''


class ShardEvaluation(DistributedStep):
    DESCRIPTION = "Evaluate summed metrics on a share of the set per process, then add up."
    needs = ("+=",)

    def visit_Module(self, node: cst.Module) -> None:
        self.samplers: dict[cst.Call, str] = {}  # eval DataLoader call -> its sampler
        writers = find_side_effects(node, self.script.index).writer_functions
        reductions = LossReductions(self.script)
        by_loader: dict[cst.Call, list[StepLoop]] = {}
        for step in self.script.training.step_loops.values():
            for loader in step.loaders:
                if isinstance(loader.node, cst.Call):
                    by_loader.setdefault(loader.node, []).append(step)
        sums = {
            step: self._sums(step, reductions, writers)
            for steps in by_loader.values()
            for step in steps
        }
        shardable = self._shardable(by_loader, sums)
        sharded = [call for call in by_loader if call in shardable]  # in the order of the loops
        for call in sharded:
            dataset = name_key(call.args[0].value)
            self.samplers[call] = (
                f"range({RANK}, len({dataset}), {WORLD_SIZE}) if {DISTRIBUTED} else None"
            )
        for step in dict.fromkeys(step for call in sharded for step in by_loader[call]):
            self._add_up(step, sums[step])  # type: ignore[arg-type]
        if self.samplers:
            self.define_helper(node, HELPER, _HELPER_CODE)
            self.imports.append(DIST_IMPORT)

    def _shardable(
        self, by_loader: dict[cst.Call, list[StepLoop]], sums: dict[StepLoop, list[str] | None]
    ) -> set[cst.Call]:
        """The loaders that read a share per process. An evaluation adds up its sums only
        if every loader it reads is sharded, so a loader that shares an evaluation with
        one that cannot be sharded keeps its whole set too."""
        sharded = {call for call, steps in by_loader.items() if self._may_shard(call, steps, sums)}
        while True:
            whole = {
                call
                for call in sharded
                for step in by_loader[call]
                if not all(loader.node in sharded for loader in step.loaders)
            }
            if not whole:
                return sharded
            sharded -= whole

    def _add_up(self, step: StepLoop, names: list[str]) -> None:
        """All-reduce the sums `names` of the evaluation `step` right after its loop."""
        names_code = ", ".join(names)
        targets = f"({names_code},)" if len(names) == 1 else names_code
        self.after.setdefault(self.statement_of(step.node), []).extend(
            parse_statements(
                f"if {DISTRIBUTED}:  # each process evaluated its share: add up\n"
                f"    {targets} = {HELPER}({names_code})\n"
            )
        )
        self.changed(
            step.node,
            f"evaluation on a share of the set per process; its sums ({names_code}) added"
            f" up over the processes with `{HELPER}()`: the original's numbers",
        )

    def _may_shard(
        self, call: cst.Call, steps: list[StepLoop], sums: dict[StepLoop, list[str] | None]
    ) -> bool:
        """Whether the DataLoader `call` may read a share of its set on each process: it
        and the evaluations that read it are code of this module (a loader built in
        another module would keep its whole set while the sums are added up), each
        evaluation only sums, and the loader has a named dataset, no sampler, no shuffle."""
        program = self.script.program
        assert program is not None
        here = self.script.module
        return (
            program.module_of.get(call) is here
            and all(step.module is here and sums[step] is not None for step in steps)
            and bool(call.args)
            and not call.args[0].keyword
            and name_key(call.args[0].value) is not None
            and self._may_take_sampler(call)
        )

    def _sums(
        self, step: StepLoop, reductions: LossReductions, writers: set[cst.FunctionDef]
    ) -> list[str] | None:
        """The accumulators of an evaluation loop whose every effect is a sum over its
        batches (`total += x.sum().item()`); None when it keeps anything else."""
        loop = step.node
        if step.role is not LoopRole.EVAL or not isinstance(loop, cst.For) or step.function is None:
            return None
        if step.function.node in writers or not self._runs_on_every_process(step):
            return None
        if find(loop.body, (cst.Break, cst.Return, cst.Yield, cst.Global, cst.Nonlocal)):
            return None
        scope = step.function.node
        names: list[str] = []
        for node in find(loop.body, (cst.AugAssign, cst.Assign, cst.AnnAssign, cst.Call)):
            if isinstance(node, cst.AugAssign):
                if not isinstance(node.target, cst.Name) or not isinstance(
                    node.operator, cst.AddAssign
                ):
                    return None
                if _summed(node.value, reductions, scope) is not Reduction.SUM:
                    return None
                if not any(
                    isinstance(v, (cst.Integer, cst.Float))
                    for v in assigned_values(scope, node.target.value)
                ):
                    return None
                names.append(node.target.value)
            elif isinstance(node, (cst.Assign, cst.AnnAssign)):
                targets = (
                    [t.target for t in node.targets]
                    if isinstance(node, cst.Assign)
                    else [node.target]
                )
                if any(not isinstance(n, (cst.Name, cst.Tuple)) for n in targets):
                    return None  # `self.x = ...`, `preds[i] = ...`
            elif is_method_call(node, "append", "extend", "update", "add", "write"):
                return None
        return list(dict.fromkeys(names)) or None

    def _runs_on_every_process(self, step: StepLoop) -> bool:
        """Every call of the function that holds `step` is a statement of its own, not
        in a print (which runs on rank 0 only) nor under a rank test."""
        program = self.script.program
        assert program is not None and step.function is not None
        calls = program.calls_of(step.function)
        for call in calls:
            module = program.module_of[call]
            for ancestor in module.index.ancestors(call):
                if (
                    isinstance(ancestor, cst.Call)
                    and module.index.qualified_names(ancestor.func) & PRINTS
                ):
                    return False
                if isinstance(ancestor, cst.If) and mentions_rank(ancestor.test):
                    return False
        return bool(calls)

    def _may_take_sampler(self, call: cst.Call) -> bool:
        """No sampler of its own and no shuffle (also through `**kwargs`)."""
        for name in ("sampler", "batch_sampler"):
            if not isinstance(self.script.keyword(call, name), Missing):
                return False
        shuffle = self.script.keyword(call, "shuffle")
        return isinstance(shuffle, Missing) or is_false(shuffle)  # type: ignore[arg-type]

    def edited(self) -> list[cst.CSTNode]:
        return [*self.planned_statements(), *self.samplers]

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.Call:
        sampler = self.samplers.get(original_node)
        if sampler is None or keyword_value(updated_node, "sampler") is not None:
            return updated_node
        return set_keyword(updated_node, "sampler", sampler)


def _summed(value: cst.BaseExpression, reductions: LossReductions, scope: cst.CSTNode) -> Reduction:
    """A sum over the batch: `x.sum().item()`, `F.nll_loss(..., reduction="sum").item()`,
    `len(x)`, `x.size(0)` (a count of samples)."""
    while is_method_call(value, "item", "detach", "cpu", "float") and not value.args:  # type: ignore[attr-defined]
        value = value.func.value  # type: ignore[attr-defined]
    if (
        isinstance(value, cst.Call)
        and name_key(value.func) in ("float", "int")
        and len(value.args) == 1
    ):
        value = value.args[0].value
    if is_batch_size(value):
        return Reduction.SUM
    return reductions.of(value, scope)
