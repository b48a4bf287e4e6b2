"""Each process trains on its own columns of a batchified token stream.

pytorch/examples' word_language_model has no DataLoader: `batchify(data, bsz)` reshapes
the corpus into `bsz` streams side by side (one per column), and the loop walks the rows
(`get_batch(source, i)` over `range(0, data.size(0) - 1, bptt)`), carrying a hidden
state per stream from one cut to the next. Under DDP each process keeps `bsz //
WORLD_SIZE` of the columns, right after `batchify`: its streams stay whole (the hidden
states stay per stream), every process walks as many rows (as many steps), and together
they read the original's batch. A shape the training code builds from `bsz` (the hidden
state, `model.init_hidden(bsz)`) takes the per-process count of streams.

Also here, for `ShardTrainLoader`: which loops read such a tensor, which train on the
whole of their data at every step (full-batch training, nothing to shard), and which take
their batches from something other than a DataLoader.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import libcst as cst
import libcst.matchers as m

from autoaccel.analysis.index import ModuleIndex
from autoaccel.analysis.names import name_key
from autoaccel.analysis.shapes import bound_names, find, is_method_call
from autoaccel.analysis.training import StepLoop
from autoaccel.convert.transforms.distributed.progress_on_rank_zero import PROGRESS_BARS
from autoaccel.convert.transforms.distributed._base import (
    DISTRIBUTED,
    RANK,
    WORLD_SIZE,
    DistributedStep,
    parse_statements,
)
from autoaccel.cst_edit import code_of

_SHARD = f"""\
if {DISTRIBUTED}:
    # each process trains on its own {{bsz}} // {WORLD_SIZE} streams (columns)
    assert {{bsz}} % {WORLD_SIZE} == 0, "the streams must divide evenly"
    {{data}} = {{data}}.chunk({WORLD_SIZE}, dim=1)[{RANK}].contiguous()
"""


@dataclass(frozen=True)
class BatchifiedSource:
    """`train_data = batchify(corpus, args.batch_size)`, read by a training loop."""

    assign: cst.Assign
    data: str  # `train_data`
    bsz: cst.BaseExpression  # `args.batch_size`


def batchified_sources(loop: cst.CSTNode, module: cst.Module) -> Iterator[BatchifiedSource]:
    """The tensors `loop` reads that a function of `module` made by cutting a token stream
    into columns (`data.view(bsz, -1).t()`, `data.view(-1, bsz)`)."""
    read = {name_key(node) for node in find(loop, (cst.Name, cst.Attribute))}
    columns = {
        function.name.value: index
        for function in find(module, cst.FunctionDef)
        if (index := _columns_parameter(function)) is not None
    }
    for assign in find(module, cst.Assign):
        call = assign.value
        if (
            len(assign.targets) != 1
            or not isinstance(call, cst.Call)
            or not isinstance(call.func, cst.Name)
        ):
            continue
        data = name_key(assign.targets[0].target)
        index = columns.get(call.func.value)
        if data not in read or index is None:
            continue
        positional = [a.value for a in call.args if a.keyword is None and not a.star]
        bsz = positional[index] if index < len(positional) else None
        if bsz is not None:
            yield BatchifiedSource(assign, data, bsz)  # type: ignore[arg-type]


def _columns_parameter(function: cst.FunctionDef) -> int | None:
    """The index of the parameter that `function` makes the number of columns of its
    result: `bsz` in `data.view(bsz, -1).t()` or `data.view(-1, bsz)`."""
    params = [p.name.value for p in function.params.params]
    transposed = any(is_method_call(c, "t") for c in find(function.body, cst.Call)) or any(
        is_method_call(c, "transpose")
        and [code_of(a.value) for a in c.args] in (["0", "1"], ["1", "0"])
        for c in find(function.body, cst.Call)
    )
    for call in find(function.body, cst.Call):
        if not is_method_call(call, "view", "reshape") or len(call.args) != 2:
            continue
        first, second = (code_of(a.value) for a in call.args)
        for rows, cols in ((first, second), (second, first)):
            if rows == "-1" and cols in params and (cols == second) != transposed:
                return params.index(cols)
    return None


def reads_batchified(loop: cst.CSTNode, module: cst.Module) -> bool:
    """Whether `loop` reads a batchified token stream (this step's to shard)."""
    return next(batchified_sources(loop, module), None) is not None


def slices_by_counter(step: StepLoop) -> bool:
    """Whether the loop, or a function it calls, slices a tensor by the loop's counter or
    by a parameter (`data[i:i + 16]`, `get_batch(source, i)`): it reads batches of its
    data. A loop that slices nothing so trains on all of its data at every step."""
    if step.module is None:
        return True  # unknown: not taken for full-batch
    places = [
        (step.node, set(bound_names(step.node.target)) if isinstance(step.node, cst.For) else set())
    ]
    places += [
        (f.node.body, set(f.positional) - {"self"})
        for f in step.reached
        if not (f.cls and f.cls.is_module)
    ]
    return any(
        name_key(name) in counters
        for body, counters in places
        for subscript in find(body, cst.Subscript)
        for element in subscript.slice
        for name in _index_names(element.slice)
    ) or isinstance(step.node, cst.While)


def _index_names(index: cst.BaseSlice) -> list[cst.Name]:
    """The names an index reads as positions: `i` of `data[i:i + n]`, not `data` of
    `out[data.train_mask]` (a mask the object holds: gcn's full-batch training)."""
    bases = {a.value for a in find(index, cst.Attribute)}
    attributes = {a.attr for a in find(index, cst.Attribute)}
    return [n for n in find(index, cst.Name) if n not in bases and n not in attributes]


def walks_by_pointer(step: StepLoop) -> bool:
    """Whether the loop slices a tensor at a position it advances itself (`x =
    data[ptr:ptr + L]` ... `ptr += L`): it walks its data in order, all of it, whatever
    random start it may draw first (a character RNN's `ptr = np.random.randint(100)`)."""
    advanced = {name_key(a.target) for a in find(step.node.body, cst.AugAssign)}
    return any(
        name_key(name) in advanced
        for subscript in find(step.node.body, cst.Subscript)
        for element in subscript.slice
        for name in find(element.slice, cst.Name)
    )


def batch_source(loop: cst.For | cst.While, index: ModuleIndex) -> cst.BaseExpression | None:
    """What a `for` loop takes its batches from: `train_loader` of `for i, (x, y) in
    enumerate(tqdm(train_loader))`; None when it counts (`range(epochs)`,
    `itertools.count()`), and for a `while` loop."""
    if not isinstance(loop, cst.For):
        return None
    iterable = loop.iter
    while isinstance(iterable, cst.Call):
        if index.qualified_names(iterable.func) & _COUNTERS:
            return None
        first = iterable.args[0] if iterable.args else None
        if first is None or first.keyword or isinstance(first.value, _LITERALS):
            return iterable  # what makes the batches: `dl.generate_data(batch_size=256)`
        iterable = first.value
    return iterable


_LITERALS = (cst.Integer, cst.Float, cst.SimpleString)


# What counts instead of yielding batches (`tqdm.trange(n)` too: "batches from `n`" said none)
_COUNTERS = frozenset(
    {"builtins.range", "itertools.count", *(n for n in PROGRESS_BARS if n.endswith("trange"))}
)


class ShardStreamColumns(DistributedStep):
    DESCRIPTION = "Give each process its own columns (streams) of a batchified token tensor."

    def visit_Module(self, node: cst.Module) -> None:
        self.arguments: dict[cst.Arg, str] = {}  # a `bsz` argument -> the per-process count
        for loop in self.train_loops():
            if self.script.step_loops[loop].loaders:
                continue
            for source in batchified_sources(loop, node):
                self._shard(loop, source)

    def _shard(self, loop: cst.For | cst.While, source: BatchifiedSource) -> None:
        statement = self.statement_of(source.assign)
        block = self.parent(statement)
        body = list(block.body) if isinstance(block, (cst.IndentedBlock, cst.Module)) else []
        following = body[body.index(statement) + 1] if statement in body[:-1] else None
        if following is not None and f"{source.data}.chunk({WORLD_SIZE}" in code_of(following):
            return  # sharded already
        bsz = code_of(source.bsz)
        if not m.matches(source.bsz, m.Name() | m.Attribute()):
            self.skipped(
                "per-process streams",
                f"the batch of streams `{bsz}` is not a variable the training code can be seen to"
                f" use; keep {source.data}'s columns `{RANK}::{WORLD_SIZE}` on each process by hand",
                source.assign,
                wrong=True,
            )
            return
        self.after.setdefault(statement, []).extend(
            parse_statements(_SHARD.format(data=source.data, bsz=bsz))
        )
        self.changed(
            statement,
            f"each process trains on its own `{bsz} // {WORLD_SIZE}` streams (columns) of"
            f" `{source.data}`: hidden states stay per stream, every process takes as many"
            " steps, and together they read the original's batch",
        )
        for argument in self._per_process_shapes(loop, source):
            self.arguments[argument] = f"{bsz} // {WORLD_SIZE}"
            self.changed(
                argument, f"`{bsz}` streams here are this process's: `{bsz} // {WORLD_SIZE}`"
            )

    def _per_process_shapes(
        self, loop: cst.For | cst.While, source: BatchifiedSource
    ) -> list[cst.Arg]:
        """The arguments `bsz` of calls where the training code builds per-stream state
        (`model.init_hidden(bsz)`, `torch.zeros(layers, bsz, hidden)`): in the function
        that holds the loop (or, at module level, the statement around it) and in the
        functions it calls. Prints keep the global number."""
        scope = self.scope_of(loop)
        region: list[cst.CSTNode] = [scope if scope is not None else self._top_statement(loop)]
        step = self.script.step_loops[loop]
        region += [
            f.node
            for f in step.reached
            if f.module is step.module and not (f.cls and f.cls.is_module)
        ]
        wanted = code_of(source.bsz)
        found = []
        for place in dict.fromkeys(region):
            for call in find(place, cst.Call):
                if call is source.assign.value or m.matches(call.func, m.Name("print")):
                    continue
                found += [a for a in call.args if a.keyword is None and code_of(a.value) == wanted]
        return [a for a in dict.fromkeys(found) if not self._in_print(a)]

    def _in_print(self, node: cst.CSTNode) -> bool:
        return any(
            isinstance(a, cst.Call) and m.matches(a.func, m.Name("print"))
            for a in self.ancestors(node)
        )

    def _top_statement(self, node: cst.CSTNode) -> cst.CSTNode:
        child = node
        for ancestor in self.ancestors(node):
            if isinstance(ancestor, cst.Module):
                return child
            child = ancestor
        return child

    def edited(self) -> list[cst.CSTNode]:
        return [*self.planned_statements(), *self.arguments]

    def leave_Arg(self, original_node: cst.Arg, updated_node: cst.Arg) -> cst.Arg:
        value = self.arguments.get(original_node)
        return (
            updated_node
            if value is None
            else updated_node.with_changes(value=cst.parse_expression(value))
        )
