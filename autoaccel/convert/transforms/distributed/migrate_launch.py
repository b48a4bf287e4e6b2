"""`torch.distributed.launch` and apex.parallel scripts -> a script that torchrun starts.

Such a script sets up torch.distributed itself. This step, before `InitProcessGroup`,
takes that set-up out so that the `--to ddp` steps after it put in their own (the set-up
block, the DDP wrapper, rank-0 guards), which also run with plain `python`:

* `dist.init_process_group(...)` and `torch.cuda.set_device(...)` go (the set-up block
  does both from torchrun's environment);
* `model = DDP(model, ...)` (torch's or `apex.parallel.DistributedDataParallel`) goes and
  `model.module` becomes `model`: `WrapModel` wraps the model again;
* `apex.parallel.convert_syncbn_model(model)` -> `torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)`;
* `args.local_rank` -> `LOCAL_RANK` (from the environment; `LOCAL_RANK if DISTRIBUTED else -1`
  where the argument's default is -1, so that the script's test for "not launched" still
  holds under plain `python`); the `--local_rank` argument
  stays, with the `--local-rank` spelling of torch >= 2.0's launcher, so old launch
  commands still work;
* `dist.get_rank()`, `dist.get_world_size()` -> `RANK`, `WORLD_SIZE`; a `DistributedSampler`
  that asks the process group gets `num_replicas=WORLD_SIZE, rank=RANK`;
* `dist.all_reduce`, `dist.broadcast`, `dist.barrier` statements run `if DISTRIBUTED:`
  (on one process they change nothing).

Any other use of apex.parallel is listed with its line and nothing changes (fail closed).
A script without a `--local_rank` argument or apex.parallel is left to `InitProcessGroup`.
"""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from autoaccel.analysis.names import name_key
from autoaccel.analysis.script_model import DISTRIBUTED_DATA_PARALLEL, DISTRIBUTED_SAMPLER
from autoaccel.analysis.shapes import find
from autoaccel.convert.transform import StatementRewrite
from autoaccel.convert.transforms.distributed._base import (
    DISTRIBUTED,
    INIT_PROCESS_GROUP,
    LOCAL_RANK,
    RANK,
    WORLD_SIZE,
    DistributedStep,
    has_setup_block,
    parse_statements,
)
from autoaccel.convert.transforms.distributed._legacy import (
    LegacyMigration,
    is_call_statement,
    keyword_args,
)
from autoaccel.convert.transforms.distributed.migrate_horovod import SET_DEVICE
from autoaccel.cst_edit import code_of, keyword_value, set_keyword

APEX_DDP = "apex.parallel.DistributedDataParallel"
APEX_SYNC_BN = "apex.parallel.convert_syncbn_model"
_WRAPPERS = frozenset({APEX_DDP, DISTRIBUTED_DATA_PARALLEL})
# Options of the wrappers that only tune when gradients travel (DDP decides that itself).
_TUNING = frozenset(
    {"device_ids", "output_device", "delay_allreduce", "message_size", "bucket_cap_mb"}
)
_PLACES = {"torch.distributed.get_rank": RANK, "torch.distributed.get_world_size": WORLD_SIZE}
# Collectives that change nothing on one process: they run only when distributed.
_COLLECTIVES = frozenset(
    {"torch.distributed.all_reduce", "torch.distributed.broadcast", "torch.distributed.barrier"}
)
LAUNCH_FLAG = '"--local_rank"'
NEW_LAUNCH_FLAG = '"--local-rank"'
_ADD_ARGUMENT = m.Call(func=m.Attribute(attr=m.Name("add_argument")))
_PARSE_ARGS = m.Call(func=m.Attribute(attr=m.Name("parse_args")))


class MigrateLaunch(LegacyMigration, DistributedStep):
    DESCRIPTION = "Replace a torch.distributed.launch / apex.parallel set-up by torchrun's."
    needs = ("local_rank", "apex")
    library = "apex.parallel"
    label = "torchrun"
    root = "apex.parallel"
    package = "apex"

    def transform_module(self, tree: cst.Module) -> cst.Module:
        # Runs before the set-up block exists (a converted script has it: nothing to do).
        if has_setup_block(tree):
            return tree
        return StatementRewrite.transform_module(self, tree)

    def visit_Module(self, node: cst.Module) -> None:
        self.start_migration()
        flag = self._launch_argument(node)
        if flag is None and not any(
            self._in_library(n) for n in find(node, (cst.Name, cst.Attribute))
        ):
            return  # neither launch style nor apex: `InitProcessGroup` decides
        if flag is not None:
            self._read_local_rank(node, flag)
        self.unwrapped: set[str] = set()
        for call in find(node, cst.Call):
            if not self.handled_inside(call):
                self._migrate(call)
        self._unwrap_modules(node)
        self.finish_migration(node)

    def _migrate(self, call: cst.Call) -> None:
        names = self.qualified_names(call.func)
        if names & INIT_PROCESS_GROUP:
            self.drop(
                call,
                "`init_process_group` removed: the set-up block starts it from torchrun's environment",
            )
        elif SET_DEVICE in names:
            self.drop(
                call,
                "`torch.cuda.set_device` removed: the set-up block sets the device of LOCAL_RANK",
            )
        elif names & _PLACES.keys():
            self.replace_expression(call, _PLACES[min(names & _PLACES.keys())])
        elif names & _WRAPPERS:
            self._remove_wrapper(call)
        elif APEX_SYNC_BN in names:
            if len(call.args) != 1 or call.args[0].keyword is not None:
                self.unsupported(call, "`convert_syncbn_model` with options")
                return
            model = code_of(call.args[0].value)
            self.replace_expression(call, f"torch.nn.SyncBatchNorm.convert_sync_batchnorm({model})")
        elif (
            DISTRIBUTED_SAMPLER in names
            and keyword_value(call, "num_replicas") is None
            and len(call.args) == 1
        ):
            asked = set_keyword(set_keyword(call, "num_replicas", WORLD_SIZE), "rank", RANK)
            self.replace_expression(call, code_of(asked))
        elif names & _COLLECTIVES:
            self._run_when_distributed(call)

    def _launch_argument(self, module: cst.Module) -> cst.Call | None:
        """The `parser.add_argument("--local_rank", ...)` call."""
        for call in find(module, cst.Call):
            if m.matches(call, _ADD_ARGUMENT) and any(
                m.matches(a.value, m.SimpleString(LAUNCH_FLAG) | m.SimpleString("'--local_rank'"))
                for a in call.args
                if a.keyword is None
            ):
                return call
        return None

    def _read_local_rank(self, module: cst.Module, flag: cst.Call) -> None:
        """`args.local_rank` -> `LOCAL_RANK`, for the result of the parser that has the flag."""
        parser = name_key(flag.func.value)  # type: ignore[attr-defined]
        parsed = {
            name_key(target.target)
            for assign in find(module, cst.Assign)
            if m.matches(assign.value, _PARSE_ARGS) and name_key(assign.value.func.value) == parser  # type: ignore[attr-defined]
            for target in assign.targets
        }
        default = keyword_value(flag, "default")
        if m.matches(default, m.Integer("0")):
            local_rank = LOCAL_RANK
        else:  # `-1`, None: the script's own test for "not launched" still works with `python`
            local_rank = (
                f"({LOCAL_RANK} if {DISTRIBUTED} else {code_of(default) if default else None})"
            )
        for attribute in find(module, cst.Attribute):
            if attribute.attr.value != "local_rank" or name_key(attribute.value) not in parsed:
                continue
            if isinstance(self.parent(attribute), cst.AssignTarget):
                self.unsupported(attribute, "an assignment to `local_rank`")
            else:
                self.replace_expression(attribute, local_rank)
        if not any(m.matches(a.value, m.SimpleString(NEW_LAUNCH_FLAG)) for a in flag.args):
            first = flag.args[0]
            alias = cst.Arg(cst.SimpleString(NEW_LAUNCH_FLAG), comma=first.comma)
            self.expressions[flag] = flag.with_changes(
                args=[
                    first.with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))),
                    alias,
                    *flag.args[1:],
                ]
            )
            self.notes.append(
                (
                    flag,
                    "`--local_rank` kept (and `--local-rank`, torch >= 2.0's spelling) so old launch"
                    " commands still work; the script reads LOCAL_RANK from the environment",
                )
            )

    def _remove_wrapper(self, call: cst.Call) -> None:
        """`model = DDP(model, ...)` goes; `WrapModel` wraps the model again."""
        statement = self.statement_of(call)
        assign = (
            statement.body[0]
            if isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1
            else None
        )
        positional = [a.value for a in call.args if a.keyword is None and not a.star]
        if (
            not isinstance(assign, cst.Assign)
            or assign.value is not call
            or len(assign.targets) != 1
            or len(positional) != 1
            or keyword_args(call).keys() - _TUNING
            or name_key(assign.targets[0].target) != name_key(positional[0])
        ):
            self.unsupported(call, "a DistributedDataParallel other than `model = DDP(model, ...)`")
            return
        key = name_key(positional[0])
        assert key is not None
        self.unwrapped.add(key)
        self.remove_statement(statement)
        self.notes.append(
            (
                call,
                f"`{key} = {code_of(call.func)}({key}, ...)` removed: the model is wrapped in torch DDP once it is ready",
            )
        )

    def _unwrap_modules(self, module: cst.Module) -> None:
        """`model.module` -> `model`: the model itself is no longer wrapped."""
        for attribute in find(module, cst.Attribute):
            if attribute.attr.value == "module" and name_key(attribute.value) in self.unwrapped:
                self.expressions[attribute] = attribute.value
                self.notes.append(
                    (attribute, f"`{code_of(attribute)}` -> `{code_of(attribute.value)}`")
                )

    def _run_when_distributed(self, call: cst.Call) -> None:
        statement = self.statement_of(call)
        if not is_call_statement(statement, call):
            return
        guarded = parse_statements(f"if {DISTRIBUTED}:\n    {code_of(statement).strip()}\n")
        self.replace[statement] = [guarded[0].with_changes(leading_lines=statement.leading_lines)]
        self.notes.append(
            (
                call,
                f"`{code_of(call.func)}` runs only when distributed (on one process it changes nothing)",
            )
        )
