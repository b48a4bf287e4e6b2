"""Save and load whole state dicts of sharded models, so checkpoints stay the original's.

Under FSDP `model.state_dict()` holds each process's shards (DTensors) and
`model.load_state_dict()` of a whole state dict fails. Each `model.state_dict()` becomes
`full_state_dict(model)`, hoisted into a statement of its own just before the one that
used it: every process must take part in the gathering, while only rank 0 then saves
(the next step guards the save); loaded into a model not sharded there (a DQN's
`q_target.load_state_dict(q.state_dict())` before `q_target` is sharded), it is
`full_state_dict_everywhere(q)`, whole on every process. Loads become
`load_full_state_dict(model, ...)`, which spreads rank 0's state dict over the processes.
An optimizer's `state_dict()` and `load_state_dict()` of a script with one sharded model
get the same treatment. A gathering under a condition each process computes from its own
results (`if test_acc > best_acc:` around a checkpoint: FSDP leaves BatchNorm's running
statistics per process, so their evaluations may differ) goes where rank 0 decides:
`if first_process_decides(test_acc > best_acc):`, every process taking rank 0's branch;
otherwise one process would wait forever in a gathering the others skip.
"""

from __future__ import annotations

import libcst as cst

from autoaccel.analysis.names import name_key
from autoaccel.analysis.rank_guards import mentions_rank
from autoaccel.analysis.side_effects import OPENS, opens_for_writing
from autoaccel.analysis.shapes import bound_names, find, is_method_call, is_name
from autoaccel.analysis.training import optimized_parameters
from autoaccel.convert.transforms.distributed._base import (
    DIST_IMPORT,
    DistributedStep,
    fresh_name,
    parameters_of,
    parse_statements,
)
from autoaccel.convert.transforms.distributed.stop_together import (
    FIRST_PROCESS_DECIDES,
    agreed,
    agreement_helper,
)
from autoaccel.convert.transforms.fully_sharded._sharded import sharded_models
from autoaccel.convert.transforms.fully_sharded._helpers import (
    FULL_OPTIMIZER_STATE,
    FULL_STATE,
    FULL_STATE_EVERYWHERE,
    LOAD_FULL_OPTIMIZER_STATE,
    LOAD_FULL_STATE,
    SHARD,
    STATE_CODE,
)

# What each helper imports from torch.distributed.checkpoint.state_dict.
_CHECKPOINT_NAMES = {
    FULL_STATE: ("StateDictOptions", "get_model_state_dict"),
    FULL_STATE_EVERYWHERE: ("StateDictOptions", "get_model_state_dict"),
    LOAD_FULL_STATE: ("StateDictOptions", "set_model_state_dict"),
    FULL_OPTIMIZER_STATE: ("StateDictOptions", "get_optimizer_state_dict"),
    LOAD_FULL_OPTIMIZER_STATE: ("StateDictOptions", "set_optimizer_state_dict"),
}

DECIDES = FIRST_PROCESS_DECIDES
_DECIDES_CODE = agreement_helper(
    DECIDES, "rank 0: every process takes the branch rank 0 takes", "dist.broadcast(flag, src=0)"
)


class GatherStateDicts(DistributedStep):
    DESCRIPTION = "Save and load whole state dicts of FSDP-sharded models."
    code = "fsdp"
    needs = ("state_dict",)

    def visit_Module(self, node: cst.Module) -> None:
        self.rewrites: dict[cst.Call, cst.BaseExpression] = {}
        # loads: `model.load_state_dict(sd)` -> `helper(model, sd)`, the arguments as the
        # pass left them (`sd` may be a `state_dict()` call this step rewrites too)
        self.loads: dict[cst.Call, tuple[str, list[cst.Arg]]] = {}
        self.helpers: dict[cst.Call, str] = {}  # a hoisted `state_dict()` -> its helper
        self.decided: set[cst.BaseExpression] = (
            set()
        )  # tests that go through `first_process_decides()`
        self.tree = node
        models = sharded_models(node, self.script)
        if not models:
            return
        sharded = sorted(models)
        self.calls = find(node, cst.Call)
        optimizers = set(self.script.optimizers)
        bound = {name_key(t.target) for t in find(node, cst.AssignTarget)}
        used: set[str] = set()
        for call in self.calls:
            if not is_method_call(call, "state_dict", "load_state_dict") or self._in_helper(call):
                continue
            owner = name_key(call.func.value)  # type: ignore[attr-defined]
            model = owner if owner in sharded else None
            if model is None and owner in optimizers:
                model = self._model_in_scope(call, models, set(sharded)) or self._optimized_model(
                    call.func.value, set(sharded)  # type: ignore[attr-defined]
                )
                if model is None:
                    self._refuse(
                        call,
                        f"which sharded model `{owner}` optimizes is not known here; save and"
                        " load its state with `get_optimizer_state_dict` by hand",
                    )
                    continue
            if model is None:
                continue
            optimizer = owner if owner != model else None
            if call.func.attr.value == "load_state_dict":  # type: ignore[attr-defined]
                helper = LOAD_FULL_OPTIMIZER_STATE if optimizer else LOAD_FULL_STATE
                owners = [cst.Arg(cst.parse_expression(k)) for k in (model, optimizer) if k]
                self.loads[call] = (helper, owners)
                self.changed(
                    call,
                    f"`{helper}()`: rank 0's whole state dict loaded into each process's shards",
                )
            elif not call.args and self._hoist(call, model, optimizer, bound):
                helper = self.helpers[call]
            else:
                continue
            used.add(helper)
        defined = {d.name.value for d in find(node, cst.FunctionDef)}
        used -= defined
        for helper in sorted(used):
            self.define_helper(node, helper, STATE_CODE[helper])
        if self.decided:
            self.define_helper(node, DECIDES, _DECIDES_CODE)
            self.imports.append(DIST_IMPORT)
        if used:  # helpers defined before brought their imports
            names = sorted({name for helper in used for name in _CHECKPOINT_NAMES[helper]})
            self.imports.append("from torch.distributed.fsdp import FSDPModule")
            self.imports.append(
                f"from torch.distributed.checkpoint.state_dict import {', '.join(names)}"
            )

    def _hoist(self, call: cst.Call, model: str, optimizer: str | None, bound: set) -> bool:
        """`state = full_state_dict(model)` before the statement of `call`, which then
        reads `state`; False (refused) where only some processes run that statement."""
        owner = optimizer or model
        if any(isinstance(a, cst.If) and mentions_rank(a.test) for a in self.ancestors(call)):
            return self._refuse(
                call,
                f"`{owner}.state_dict()` runs on one process here, while under FSDP every"
                " process must take part in gathering it; move it out of the rank test by hand",
            )
        self._decide_on_rank_zero(call)
        name = fresh_name(f"{owner.rpartition('.')[2]}_state", bound)
        everywhere = not optimizer and self._loaded_unsharded(call)
        helper = (
            FULL_OPTIMIZER_STATE
            if optimizer
            else FULL_STATE_EVERYWHERE if everywhere else FULL_STATE
        )
        arguments = f"{model}, {optimizer}" if optimizer else model
        statement = self._file_written_around(call) or self.statement_of(call)
        self.before.setdefault(statement, []).extend(
            parse_statements(f"{name} = {helper}({arguments})\n")
        )
        self.rewrites[call] = cst.Name(name)
        self.helpers[call] = helper
        self.changed(
            call,
            f"`{helper}()`: the whole state dict gathered from every process onto "
            + ("every process, for the model it is copied into" if everywhere else "rank 0"),
        )
        return True

    def _file_written_around(self, call: cst.Call) -> cst.With | None:
        """The outermost `with open(path, "wb") as f:` around `call` in its loop or function
        (VQ-VAE's `torch.save(model.state_dict(), f)` inside one): the block goes on rank 0
        whole, while every process must gather, so the gathering goes before it."""
        found = None
        for ancestor in self.ancestors(call):
            if isinstance(ancestor, (cst.FunctionDef, cst.Lambda, cst.For, cst.While)):
                break
            if isinstance(ancestor, cst.With) and any(
                isinstance(item.item, cst.Call)
                and self.qualified_names(item.item.func) & OPENS
                and opens_for_writing(item.item)
                for item in ancestor.items
            ):
                found = ancestor
        return found

    def _decide_on_rank_zero(self, call: cst.Call) -> None:
        """Plan `first_process_decides(...)` around the tests of the `if`s around `call` (in its
        function, or around the calls of that function in this module) that compare a
        value the function computes (`acc > best_acc`, an evaluation's accuracy), which
        processes may not share."""
        scope = self.scope_of(call)
        sites: list[cst.CSTNode] = [call]
        if scope is not None:
            sites += [
                c
                for c in find(self.script.module.tree, cst.Call)
                if is_name(c.func, scope.name.value)
            ]
        for site in sites:
            computed = _computed_names(self.scope_of(site) or self.script.module.tree)
            for branch in self.ancestors(site):
                if isinstance(branch, (cst.FunctionDef, cst.Lambda)):
                    break
                if (
                    isinstance(branch, cst.If)
                    and branch.test not in self.decided
                    and not agreed(branch.test)
                    and _compares(branch.test, computed)
                ):
                    self.decided.add(branch.test)
                    self.changed(
                        branch,
                        f"`{DECIDES}()`: every process takes rank 0's branch, as all of them gather"
                        " the state dict in it (their evaluations may differ: FSDP keeps BatchNorm's"
                        " running statistics per process)",
                    )

    def leave_If(self, original_node: cst.If, updated_node: cst.If) -> cst.If:
        if original_node.test not in self.decided:
            return updated_node
        return updated_node.with_changes(
            test=cst.Call(cst.Name(DECIDES), [cst.Arg(updated_node.test)])
        )

    def _loaded_unsharded(self, call: cst.Call) -> bool:
        """Whether `call` (`q.state_dict()`) is loaded straight into a model that is not
        sharded where it loads: `q_target.load_state_dict(q.state_dict())` before (or
        without) `shard_model(q_target)`. Each process then loads the dict it holds."""
        arg = self.parent(call)
        load = self.parent(arg) if isinstance(arg, cst.Arg) else None
        if not isinstance(load, cst.Call) or not is_method_call(load, "load_state_dict"):
            return False
        target = name_key(load.func.value)  # type: ignore[attr-defined]
        shards = [
            position for position, c in enumerate(self.calls)
            if is_name(c.func, SHARD) and c.args and name_key(c.args[0].value) == target
        ]  # fmt: skip
        return not shards or shards[0] > self.calls.index(load)

    def _model_in_scope(self, call: cst.Call, models: set[str], sharded: set[str]) -> str | None:
        """The one sharded model that code at `call` sees: a parameter of its function
        that receives one, else the script's only sharded model where that is bound, or
        read as the module's global (pytorch-speech-commands' `train(epoch)` saves the
        global `optimizer` of the global `model`)."""
        scope = self.scope_of(call)
        received = [p for p in parameters_of(scope) if p in sharded]
        if len(received) == 1:
            return received[0]
        if received or len(models) != 1:
            return None
        (model,) = models
        binds = [
            self.scope_of(t)
            for t in find(self.tree, cst.AssignTarget)
            if name_key(t.target) == model
        ]
        bound_here = scope is None or scope in binds
        read_global = None in binds and scope not in binds
        return model if bound_here or read_global or model.startswith("self.") else None

    def _optimized_model(self, optimizer: cst.BaseExpression, sharded: set[str]) -> str | None:
        """The one sharded model whose parameters the optimizer `optimizer` holds, by the
        program's values (a GAN's checkpoint saves `optimizerG` and `optimizerD` beside
        `netG` and `netD`); None where that is not one."""
        program = self.script.program
        if program is None:
            return None
        given = self.script.values(optimizer)
        models = {
            model
            for made, parameters in optimized_parameters(program)
            if made in given
            for model in program.parameters_of(parameters)
        }
        holding = [key for key in sorted(sharded) if set(self.script.held_by(key)) & models]
        return holding[0] if len(holding) == 1 else None

    def _in_helper(self, call: cst.Call) -> bool:
        """Whether `call` is the plain-module branch of one of the helpers."""
        scope = self.scope_of(call)
        return scope is not None and scope.name.value in STATE_CODE

    def _refuse(self, node: cst.CSTNode, reason: str) -> bool:
        self.skipped("full state dict", reason, node, wrong=True)
        return False

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        load = self.loads.get(original_node)
        if load is not None:
            helper, owners = load
            return cst.Call(cst.Name(helper), [*owners, *updated_node.args])
        return self.rewrites.get(original_node, updated_node)


_ORDERINGS = (cst.LessThan, cst.LessThanEqual, cst.GreaterThan, cst.GreaterThanEqual)


def _computed_names(scope: cst.CSTNode) -> set[str]:
    """The names `scope` assigns (`=`, `+=`) something other than a literal."""
    names = set()
    for assign in find(scope, (cst.Assign, cst.AugAssign)):
        if isinstance(assign.value, (cst.Integer, cst.Float, cst.SimpleString, cst.Name)) and not (
            isinstance(assign, cst.AugAssign)
        ):
            continue
        targets = (
            [t.target for t in assign.targets]
            if isinstance(assign, cst.Assign)
            else [assign.target]
        )
        names.update(name for target in targets for name in bound_names(target))
    return names


def _compares(test: cst.BaseExpression, computed: set[str]) -> bool:
    """Whether `test` orders (`<`, `>=`, ...) a value of `computed` against another."""
    return any(
        isinstance(target.operator, _ORDERINGS)
        and computed & {n.value for n in find(comparison, cst.Name)}
        for comparison in find(test, cst.Comparison)
        for target in comparison.comparisons
    )
