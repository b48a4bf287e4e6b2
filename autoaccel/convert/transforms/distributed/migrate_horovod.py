"""Horovod -> torchrun DDP: Horovod's calls become the set-up block's names and DDP's.

Runs after `WrapModel`, so the model already trains through its DDP wrapper:

* `hvd.init()` and `hvd.shutdown()` go (the set-up block starts the process group, the
  script ends by destroying it), and so does
  `torch.cuda.set_device(hvd.local_rank())` (the set-up block sets the device);
* `hvd.rank()`, `hvd.size()`, `hvd.local_rank()` -> `RANK`, `WORLD_SIZE`, `LOCAL_RANK`, and
  `hvd.local_size()` -> torchrun's `LOCAL_WORLD_SIZE`; a learning rate scaled by
  `hvd.size()`, a `DistributedSampler(num_replicas=hvd.size(), rank=hvd.rank())` keep
  their meaning with torchrun's values;
* `hvd.broadcast_parameters` / `hvd.broadcast_optimizer_state` go: DDP copies rank 0's
  parameters and buffers to every process when it wraps the model;
* `optimizer = hvd.DistributedOptimizer(optimizer, ...)` goes: the DDP wrapper averages
  the gradients in `backward()` (and `no_sync` skips the accumulation micro-steps of
  `backward_passes_per_step`); `compression=hvd.Compression.fp16` becomes DDP's fp16
  compression hook on the wrapper;
* `hvd.allreduce(tensor, ...)` -> `average_over_processes(tensor)` (or
  `sum_over_processes` for `op=hvd.Sum` / `average=False`), a helper over `dist.all_reduce`.

Any other use of Horovod is listed with its line and nothing is migrated (fail closed).
"""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from autoaccel.analysis.names import name_key
from autoaccel.analysis.script_model import DISTRIBUTED_DATA_PARALLEL, DISTRIBUTED_SAMPLER, LoopRole
from autoaccel.analysis.shapes import find
from autoaccel.convert.transforms.distributed._base import (
    DISTRIBUTED,
    LOCAL_RANK,
    RANK,
    WORLD_SIZE,
    DistributedStep,
    ddp_name,
    parse_statements,
)
from autoaccel.convert.transforms.distributed._legacy import LegacyMigration, keyword_args
from autoaccel.cst_edit import code_of, keyword_value

HVD = "horovod.torch"
_LOCAL_SIZE = 'int(os.environ.get("LOCAL_WORLD_SIZE", 1))'
# The process's place in the job, by the name of the Horovod function that tells it.
_PLACES = {
    f"{HVD}.rank": RANK,
    f"{HVD}.size": WORLD_SIZE,
    f"{HVD}.local_rank": LOCAL_RANK,
    f"{HVD}.local_size": _LOCAL_SIZE,
}
_INIT, _SHUTDOWN = f"{HVD}.init", f"{HVD}.shutdown"
_BROADCASTS = frozenset({f"{HVD}.broadcast_parameters", f"{HVD}.broadcast_optimizer_state"})
_OPTIMIZER = f"{HVD}.DistributedOptimizer"
_ALLREDUCE = f"{HVD}.allreduce"
_AVERAGE, _SUM = f"{HVD}.Average", f"{HVD}.Sum"
_FP16, _NO_COMPRESSION = f"{HVD}.Compression.fp16", f"{HVD}.Compression.none"
SET_DEVICE = "torch.cuda.set_device"
AVERAGE_HELPER = "average_over_processes"
SUM_HELPER = "sum_over_processes"
_HELPERS = {
    AVERAGE_HELPER: f'''
def {AVERAGE_HELPER}(tensor):
    """The mean of `tensor` over the processes, as a new tensor (Horovod's `hvd.allreduce`)."""
    return {SUM_HELPER}(tensor) / {WORLD_SIZE}
''',
    SUM_HELPER: f'''
def {SUM_HELPER}(tensor):
    """The sum of `tensor` over the processes, as a new tensor (`hvd.allreduce(op=hvd.Sum)`)."""
    tensor = tensor.detach().clone()
    if {DISTRIBUTED}:
        dist.all_reduce(tensor)
    return tensor
''',
}
# What `hvd.DistributedOptimizer` may be given (anything else: migrated by hand).
_OPTIMIZER_KEYWORDS = frozenset(
    {"optimizer", "named_parameters", "compression", "backward_passes_per_step", "op"}
)
# Methods Horovod's DistributedOptimizer adds to the optimizer it wraps.
_OPTIMIZER_METHODS = frozenset({"synchronize", "skip_synchronize", "set_backward_passes_per_step"})
FP16_HOOK_IMPORT = "from torch.distributed.algorithms.ddp_comm_hooks import default_hooks"


class MigrateHorovod(LegacyMigration, DistributedStep):
    DESCRIPTION = "Replace Horovod by the torchrun set-up and DistributedDataParallel."
    needs = ("horovod",)
    library = label = "Horovod"
    root = "horovod"

    def visit_Module(self, node: cst.Module) -> None:
        self.start_migration()
        helpers: set[str] = set()
        for call in find(node, cst.Call):
            names = self.qualified_names(call.func)
            if self.handled_inside(call):
                continue
            if names & _PLACES.keys():
                place = _PLACES[min(names & _PLACES.keys())]
                self.replace_expression(call, place)
                if place == _LOCAL_SIZE:
                    self.imports.append("import os")
            elif _INIT in names:
                self.drop(call, "`hvd.init()` removed: the set-up block starts the process group")
            elif _SHUTDOWN in names:
                self.drop(
                    call,
                    "`hvd.shutdown()` removed: the script ends with `dist.destroy_process_group()`",
                )
            elif SET_DEVICE in names and self._sets_local_device(call):
                self.drop(
                    call,
                    "`torch.cuda.set_device(hvd.local_rank())` removed: the set-up block sets it",
                )
            elif names & _BROADCASTS:
                self.drop(
                    call,
                    "Horovod broadcast removed: DDP copies rank 0's parameters and buffers to every"
                    " process when it wraps the model, and every process builds the same optimizer state",
                )
            elif _OPTIMIZER in names:
                self._replace_optimizer(node, call)
            elif _ALLREDUCE in names:
                helper = self._allreduce_helper(call)
                if helper is not None:
                    helpers.add(helper)
                    helpers.add(SUM_HELPER)
                    self.replace_expression(call, f"{helper}({code_of(call.args[0].value)})")
        if not self.options.per_process_batch:
            self._check_batches_per_worker(node)
        if not self.finish_migration(node):
            return
        for helper in sorted(helpers):
            self.define_helper(node, helper, _HELPERS[helper])

    def _check_batches_per_worker(self, module: cst.Module) -> None:
        """Horovod's batch size is per worker: a training DataLoader with the script's own
        DistributedSampler (`num_replicas=hvd.size()`) keeps it; one without would get a
        share of it (`--to ddp` keeps the global batch) while the learning rate stays
        scaled for the larger one."""
        for loop in self.script.step_loops.values():
            if loop.role is not LoopRole.TRAIN:
                continue
            for loader in loop.loaders:
                if loader.module is self.script.module and not self._own_sampler(
                    module, loader.node
                ):
                    self.unsupported(
                        loader.node,
                        "a training DataLoader without a DistributedSampler: Horovod's batch is per"
                        " worker; convert with `--per-process-batch` to keep it so",
                    )

    def _own_sampler(self, module: cst.Module, loader: cst.CSTNode) -> bool:
        """Whether `loader` reads through a `DistributedSampler(..., num_replicas=...)`
        (passed, or assigned to the name passed)."""
        sampler = keyword_value(loader, "sampler") if isinstance(loader, cst.Call) else None
        if sampler is None:
            return False
        key = name_key(sampler)
        values = [sampler] + [
            assign.value
            for assign in find(module, cst.Assign)
            if key is not None and any(name_key(t.target) == key for t in assign.targets)
        ]
        return any(
            DISTRIBUTED_SAMPLER in self.qualified_names(call.func)
            and keyword_value(call, "num_replicas") is not None
            for value in values
            for call in find(value, cst.Call)
        )

    def _sets_local_device(self, call: cst.Call) -> bool:
        """`torch.cuda.set_device(hvd.local_rank())`."""
        return (
            len(call.args) == 1
            and isinstance(call.args[0].value, cst.Call)
            and (f"{HVD}.local_rank" in self.qualified_names(call.args[0].value.func))
        )

    def _allreduce_helper(self, call: cst.Call) -> str | None:
        """The helper that replaces `hvd.allreduce(tensor, average=..., op=..., name=...)`."""
        keywords = keyword_args(call)
        average, op = keywords.get("average"), keywords.get("op")
        if len(call.args) - len(keywords) != 1 or keywords.keys() - {"average", "op", "name"}:
            self.unsupported(
                call,
                "an `hvd.allreduce` with other arguments than a tensor, `average`, `op`, `name`",
            )
            return None
        op_names = self.qualified_names(op) if op is not None else frozenset({_AVERAGE})
        if average is not None and m.matches(average, m.Name("False")) or _SUM in op_names:
            return SUM_HELPER
        if (average is None or m.matches(average, m.Name("True"))) and _AVERAGE in op_names:
            return AVERAGE_HELPER
        self.unsupported(call, "an `hvd.allreduce` whose reduction is not a literal average or sum")
        return None

    def _replace_optimizer(self, module: cst.Module, call: cst.Call) -> None:
        """`optimizer = hvd.DistributedOptimizer(optimizer, ...)`: the assignment goes,
        fp16 compression becomes a comm hook on the model's DDP wrapper."""
        keywords = keyword_args(call)
        positional = [a.value for a in call.args if a.keyword is None and not a.star]
        inner = positional[0] if positional else keywords.get("optimizer")
        statement = self.statement_of(call)
        assign = statement.body[0] if isinstance(statement, cst.SimpleStatementLine) else None
        if (
            len(positional) > 1
            or keywords.keys() - _OPTIMIZER_KEYWORDS
            or inner is None
            or not isinstance(assign, cst.Assign)
            or assign.value is not call
            or len(assign.targets) != 1
            or name_key(assign.targets[0].target) != name_key(inner)
        ):
            self.unsupported(
                call,
                "an `hvd.DistributedOptimizer` other than `optimizer = hvd.DistributedOptimizer(optimizer,"
                " named_parameters=..., compression=..., backward_passes_per_step=..., op=hvd.Average)`",
            )
            return
        op = keywords.get("op")
        if op is not None and _AVERAGE not in self.qualified_names(op):
            self.unsupported(
                call, "a DistributedOptimizer that does not average (DDP averages the gradients)"
            )
            return
        condition = self._compression_condition(module, keywords.get("compression"))
        if condition is False:
            self.unsupported(
                call,
                "a gradient compression other than `hvd.Compression.fp16`, `.none`, or a name bound"
                " once to `hvd.Compression.fp16 if ... else hvd.Compression.none`",
            )
            return
        hook: list[cst.BaseStatement] = []
        if condition is not None:
            wrapper = self._wrapper_before(module, call, keywords.get("named_parameters"))
            if wrapper is None:
                return
            test = DISTRIBUTED if condition is True else f"{DISTRIBUTED} and {condition}"
            hook = parse_statements(
                "# Horovod's fp16 compression: the gradients travel as float16\n"
                f"if {test}:\n"
                f"    {wrapper}.register_comm_hook(None, default_hooks.fp16_compress_hook)\n"
            )
            self.imports.append(FP16_HOOK_IMPORT)
        self._optimizer_methods(module, name_key(inner))
        self.consume(statement)
        self.replace[statement] = hook
        passes = keywords.get("backward_passes_per_step")
        accumulation = (
            f"; `backward_passes_per_step={code_of(passes)}`: the accumulation micro-steps run"
            " under `no_sync()`"
            if passes is not None
            else ""
        )
        compressed = "; fp16 compression: DDP's `fp16_compress_hook`" if hook else ""
        self.notes.append(
            (
                call,
                "`hvd.DistributedOptimizer` removed: the DDP wrapper averages the gradients in"
                f" `backward()`{accumulation}{compressed}",
            )
        )

    def _compression_condition(
        self, module: cst.Module, compression: cst.BaseExpression | None
    ) -> str | bool | None:
        """When the gradients travel as fp16: always (True), never (None), under a
        condition (its code: `compression = hvd.Compression.fp16 if args.fp16 else
        hvd.Compression.none`, whose assignment then goes), or False: not known."""
        if compression is None or _NO_COMPRESSION in self.qualified_names(compression):
            return None
        if _FP16 in self.qualified_names(compression):
            return True
        key = name_key(compression) if isinstance(compression, cst.Name) else None
        assigns = [
            a for a in find(module, cst.Assign) if any(name_key(t.target) == key for t in a.targets)
        ]
        uses = [n for n in find(module, cst.Name) if n.value == key and self._is_variable(n)]
        if (
            key is None
            or len(assigns) != 1
            or len(uses) != 2
            or not isinstance(assigns[0].value, cst.IfExp)
        ):
            return False  # bound elsewhere, or used again: the assignment must stay
        choice = assigns[0].value
        body, orelse = self.qualified_names(choice.body), self.qualified_names(choice.orelse)
        test = code_of(choice.test)
        if not isinstance(choice.test, (cst.Name, cst.Attribute, cst.Call)):
            test = f"({test})"
        if _FP16 in body and _NO_COMPRESSION in orelse:
            condition = test
        elif _NO_COMPRESSION in body and _FP16 in orelse:
            condition = f"not {test}"
        else:
            return False
        self.remove_statement(self.statement_of(assigns[0]))
        return condition

    def _is_variable(self, name: cst.Name) -> bool:
        """Whether `name` names a variable (not the keyword of an argument, `f(x=...)`, or
        an attribute, `a.x`)."""
        parent = self.parent(name)
        return not (
            isinstance(parent, cst.Arg)
            and parent.keyword is name
            or isinstance(parent, cst.Attribute)
            and parent.attr is name
        )

    def _optimizer_methods(self, module: cst.Module, optimizer: str | None) -> None:
        """`optimizer.synchronize()` goes (DDP's gradients are averaged when `backward()`
        returns); Horovod's other optimizer methods have no DDP counterpart."""
        for call in find(module, cst.Call):
            func = call.func
            if not (
                isinstance(func, cst.Attribute)
                and func.attr.value in _OPTIMIZER_METHODS
                and name_key(func.value) == optimizer
            ):
                continue
            if func.attr.value == "synchronize":
                self.drop(
                    call,
                    f"`{code_of(call)}` removed: DDP has averaged the gradients when `backward()` returns",
                )
            else:
                self.unsupported(call, f"`{code_of(func)}` of Horovod's DistributedOptimizer")

    def _wrapper_before(
        self, module: cst.Module, call: cst.Call, named_parameters: cst.BaseExpression | None
    ) -> str | None:
        """The DDP wrapper of the model whose `named_parameters()` the optimizer is given,
        when it is built before `call`'s statement, in the same block."""
        model = (
            name_key(named_parameters.func.value)
            if m.matches(
                named_parameters, m.Call(func=m.Attribute(attr=m.Name("named_parameters")))
            )
            else None
        )
        wrapper = ddp_name(model) if model is not None else None
        statement = self.statement_of(call)
        block = self.parent(statement)
        earlier = list(block.body[: block.body.index(statement)]) if block is not None else []  # type: ignore[attr-defined]
        builds = wrapper is not None and any(
            name_key(target.target) == wrapper
            and isinstance(assign.value, cst.Call)
            and DISTRIBUTED_DATA_PARALLEL in self.qualified_names(assign.value.func)
            for before in earlier
            for assign in find(before, cst.Assign)
            for target in assign.targets
        )
        if not builds:
            self.unsupported(
                call,
                "fp16 compression for a model without a DDP wrapper built before this line"
                " (pass `named_parameters=model.named_parameters()`)",
            )
            return None
        return wrapper
