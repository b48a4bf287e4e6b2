"""Each process trains on its share of batches that no DataLoader makes.

A training loop over batches of the project's own making (a generator method, `for u, i, j
in dl.generate_data(batch_size=256)`; a list of batches shuffled each epoch; a torchtext
iterator; a DataLoader subclass that builds its own arguments) has no sampler to shard.
Every process makes the same batches: the same data, and random generators seeded alike
(while such a loop is there, `SeedEachRank` seeds alike every global generator the script
does not seed, and re-seeds none by rank). Of every WORLD_SIZE batches in a row, each
process takes the one at its RANK (`ShardedBatches`): together they train on the
original's batches, none on two processes, and an incomplete last round is left out, so
that every process takes as many steps. Each process trains on whole batches, so the
global batch is WORLD_SIZE times the original's and an epoch takes 1/WORLD_SIZE of the
steps (as a DataLoader's with `--per-process-batch`); each process also makes every batch:
the cost of making them, not of training on them, is paid on every process.

Where the batches are bound to a name that its scope only iterates and measures
(`batches = self.create_batches()`, then `for batch in batches` and `len(batches)`), the
assignment is wrapped, so that `len()` counts this process's batches; otherwise the loop's
iterable is, and so is the argument of each `len()` of it in the loop's scope (an average
over the epoch's batches divides by this process's count); not where the loop indexes with
its count (`ys[i]`), which stays the original's. Also here, for `ShardTrainLoader` and `SeedEachRank`: which loops this step
shares out, and the loops around a training loop that draw random numbers (rollouts).
"""

from __future__ import annotations

from collections.abc import Iterator

import libcst as cst

from autoaccel.analysis.fresh_data import Generator, fresh_draws, generator_of
from autoaccel.analysis.index import ModuleIndex
from autoaccel.analysis.names import name_key
from autoaccel.analysis.permuted_rows import permuted_batches
from autoaccel.analysis.program import SourceModule
from autoaccel.analysis.script_model import LoopRole, ScriptModel
from autoaccel.analysis.shapes import bound_names, find, is_name
from autoaccel.analysis.training import StepLoop
from autoaccel.convert.transforms.distributed._base import (
    RANK,
    WORLD_SIZE,
    DistributedStep,
    uncalled_function,
)
from autoaccel.convert.transforms.distributed.progress_on_rank_zero import PROGRESS_BARS
from autoaccel.convert.transforms.distributed.shard_stream_columns import (
    batch_source,
    reads_batchified,
    slices_by_counter,
)
from autoaccel.cst_edit import code_of

SHARDED_BATCHES = "ShardedBatches"
_SHARDED_BATCHES_CLASS = f'''

class {SHARDED_BATCHES}:
    """This process's share of `batches`, which every process makes alike: of every
    {WORLD_SIZE} batches in a row, the one at its {RANK}. An incomplete last round is left
    out, so that every process takes as many steps."""

    def __init__(self, batches):
        self.batches = batches

    def __iter__(self):
        rounds = zip(*[iter(self.batches)] * {WORLD_SIZE})
        return (batches[{RANK}] for batches in rounds)

    def __len__(self):
        return len(self.batches) // {WORLD_SIZE}
'''
# Calls that hand on the batches of their first argument: `enumerate(tqdm(batches))`.
_PASS_THROUGH = frozenset({"builtins.enumerate", *PROGRESS_BARS})


def shared_batches(loop: cst.For, index: ModuleIndex) -> tuple[cst.BaseExpression, int]:
    """What `loop` iterates for its batches, below `enumerate()` and progress bars, and
    how many such calls wrap it: (`batches`, 2) of `for i, b in enumerate(tqdm(batches))`."""
    iterable, depth = loop.iter, 0
    while (
        isinstance(iterable, cst.Call)
        and index.qualified_names(iterable.func) & _PASS_THROUGH
        and iterable.args
        and iterable.args[0].keyword is None
        and not iterable.args[0].star
    ):
        iterable, depth = iterable.args[0].value, depth + 1
    return iterable, depth


def shared_loops(script: ScriptModel) -> list[StepLoop]:
    """The training loops of the script's module whose batches come from something other
    than a DataLoader, made alike on every process, which this step shares out by rounds:
    not a token stream cut into columns, nor rows cut by a `torch.randperm`, nor batches
    drawn at random each step or collected in rounds (each process draws its own), nor a
    loop nothing runs."""
    index = script.index
    if script.module is None or index is None:
        return []
    tree = script.module.tree
    return [
        step
        for step in script.step_loops.values()
        if step.role is LoopRole.TRAIN
        and not step.loaders
        and isinstance(step.node, cst.For)
        and (batch_source(step.node, index) is not None or _offsets(step, script))
        and not reads_batchified(step.node, tree)
        and uncalled_function(step, script.program) is None
        and permuted_batches(step, script) is None
        and not fresh_draws(step, script.program)
        and not round_draws(step, script, name_key(shared_batches(step.node, index)[0]))
    ]


def _offsets(step: StepLoop, script: ScriptModel) -> bool:
    """Whether `step` is a `for` loop over a `range()` of the batches' positions that slices
    its data at them (`for i in range(0, len(data), bs): x, y = get_batch(data, i, bs)`),
    each step on its own: no state its model returns is fed back to it in the next step
    (`out, hidden = model(x, hidden)` reads its chunks in order, one after another). Not a
    count of steps (`for step in range(1, 25): x = random_batch()`)."""
    loop, index = step.node, script.index
    assert isinstance(loop, cst.For) and index is not None
    iterable, depth = shared_batches(loop, index)
    if isinstance(iterable, cst.Call) and code_of(iterable.func) == SHARDED_BATCHES:
        iterable = iterable.args[0].value  # shared out already
    if not (
        isinstance(iterable, cst.Call)
        and "builtins.range" in index.qualified_names(iterable.func)
        and slices_by_counter(step)
        and not carried_state(loop)
    ):
        return False
    target: cst.BaseExpression = loop.target
    if depth and isinstance(target, cst.Tuple) and len(target.elements) == 2:
        target = target.elements[1].value  # `i` of `for batch, i in enumerate(range(...))`
    if not isinstance(target, cst.Name):
        return False
    position = target.value
    return any(
        is_name(name, position)
        for subscript in find(loop.body, cst.Subscript)
        for element in subscript.slice
        for name in find(element.slice, cst.Name)
    ) or any(
        is_name(arg.value, position)
        for call in find(loop.body, cst.Call)
        if script.callees(call)
        for arg in call.args
    )


def carried_state(loop: cst.For | cst.While) -> set[str]:
    """The names that a call of `loop`'s body reads before the body binds them, and that
    the body then binds to what a call returns: state one step hands the next."""
    lines = list(find(loop.body, cst.SimpleStatementLine))
    bound: dict[str, list[int]] = {}
    for position, line in enumerate(lines):
        for assign in find(line, cst.Assign):
            if isinstance(assign.value, cst.Call):
                for target in assign.targets:
                    for name in bound_names(target.target):
                        bound.setdefault(name, []).append(position)
    return {
        name.value
        for position, line in enumerate(lines)
        for call in find(line, cst.Call)
        for name in _read_names(call)
        if (binds := bound.get(name.value)) and min(binds) >= position
    }


def _read_names(call: cst.Call) -> list[cst.Name]:
    """The names `call` reads, in its arguments or as the object of its method
    (`hidden` of `model(x, hidden.detach())` and of `hidden.detach()`)."""
    named = {a.attr for a in find(call, cst.Attribute)}
    named |= {a.keyword for a in find(call, cst.Arg) if a.keyword is not None}
    return [n for n in find(call, cst.Name) if n not in named and n is not call.func]


def step_sites(step: StepLoop, script: ScriptModel) -> list[tuple[cst.CSTNode, SourceModule]]:
    """The step loop, and the calls of the program that run the function holding it,
    directly or through others, each with its module."""
    sites: list[tuple[cst.CSTNode, SourceModule]] = (
        [(step.node, step.module)] if step.module else []
    )
    program = script.program
    seen: set = set()
    todo = [step.function]
    while program is not None and todo:
        function = todo.pop()
        if function is None or function in seen:
            continue
        seen.add(function)
        for call in program.calls_of(function):
            sites.append((call, program.module_of[call]))
            todo.append(program.function_of.get(call))
    return sites


def rounds(
    step: StepLoop, script: ScriptModel
) -> Iterator[tuple[cst.For | cst.While, cst.CSTNode, SourceModule]]:
    """The loops around the training steps (around the loop, or around a call that runs
    it), innermost first, each with that loop or call and its module."""
    for site, module in step_sites(step, script):
        for loop in module.index.ancestors(site):
            if isinstance(loop, (cst.FunctionDef, cst.Lambda, cst.ClassDef)):
                break  # the calls of the function are sites of their own
            if isinstance(loop, (cst.For, cst.While)):
                yield loop, site, module


def round_draws(
    step: StepLoop, script: ScriptModel, batches: str | None = None
) -> frozenset[Generator]:
    """The global generators that a loop around the training steps draws from besides
    them: a PPO round collects new rollouts (`agent.act(torch.randn(4))`), then trains on
    all of them for a few steps. Each process collects its own. Not a shuffle of the
    `batches` the training loop reads (`random.shuffle(batches)` every epoch)."""
    drawn = {
        generator_of(call, module.index)
        for loop, _, module in rounds(step, script)
        for call in find(loop.body, cst.Call)
        if step.node not in module.index.ancestors(call)
        and not (batches and any(name_key(a.value) == batches for a in call.args))
    }
    return frozenset(drawn - {None})  # type: ignore[arg-type]


class ShardBatchRounds(DistributedStep):
    DESCRIPTION = "Give each process every WORLD_SIZE-th batch of batches no DataLoader makes."

    def visit_Module(self, node: cst.Module) -> None:
        self.tree = node
        self.loops: dict[cst.For, int] = {}  # loop -> calls around the iterable it wraps
        self.assignments: set[cst.Assign] = set()
        self.lengths: set[cst.Call] = set()  # `len(batches)` of a loop wrapped where it iterates
        self.shared = shared_loops(self.script)
        for step in self.shared:
            if self.in_entry_script:
                self._share(step.node)  # type: ignore[arg-type]
            else:  # the entry script's seeds decide whether the processes make them alike
                self.skipped(
                    "per-process batches",
                    "this training loop takes its batches from"
                    f" `{code_of(step.node.iter)}`, which no DataLoader makes, in a module the"  # type: ignore[union-attr]
                    " script imports: give each process its share by hand (e.g. every"
                    f" {WORLD_SIZE}-th batch from its {RANK})",
                    step.node,
                    wrong=True,
                )
        if self.loops or self.assignments:
            self.define_helper(node, SHARDED_BATCHES, _SHARDED_BATCHES_CLASS)

    def _share(self, loop: cst.For) -> None:
        assert self.script.index is not None
        batches, depth = shared_batches(loop, self.script.index)
        assignment = self._sole_assignment(batches)
        made = assignment.value if assignment is not None else batches
        if self._is_shared(made):
            return
        counted = self._counted_depth(loop)
        if counted is not None:  # `ys[i]` of `for i, x in enumerate(xs)`: keep `i` whole
            batches = _unwrapped(loop.iter, counted)
            self.loops[loop] = counted
        elif (
            assignment is not None
            and isinstance(batches, cst.Name)
            and self._only_iterated(batches)
        ):
            self.assignments.add(assignment)
        else:
            self.loops[loop] = depth
            self.lengths |= self._measured(loop, batches)
        self.log.batch_rounds = True
        self.changed(
            loop,
            f"each process trains on its share of the batches of `{code_of(batches)}`, which"
            f" every process makes alike: of every {WORLD_SIZE} in a row, the one at its"
            f" {RANK} ({SHARDED_BATCHES}); the global batch is {WORLD_SIZE} times the"
            " original's",
        )

    def _measured(self, loop: cst.For, batches: cst.BaseExpression) -> set[cst.Call]:
        """The `len(batches)` calls of `loop`'s scope (hyunwoongko/transformer's `epoch_loss /
        len(iterator)` after `for i, batch in enumerate(iterator)`): once the loop takes this
        process's share, they count that share, `len(ShardedBatches(batches))`."""
        key = name_key(batches)
        index = self.script.index
        scope = self.scope_of(loop)
        region = scope.body if scope is not None else self.tree
        if key is None or index is None:
            return set()
        return {
            call
            for call in _len_calls(region, index)
            if name_key(call.args[0].value) == key and self.scope_of(call) is scope
        }

    def _counted_depth(self, loop: cst.For) -> int | None:
        """How many pass-through calls sit above the `enumerate()` of `loop`, when the loop
        indexes something with its count (`ys[i]` of `for i, x in enumerate(xs)`): the
        share goes around the `enumerate()`, so that `i` stays the original's index of
        `x`. None otherwise (the count is then this process's own)."""
        target = loop.target
        if not isinstance(target, (cst.Tuple, cst.List)) or not target.elements:
            return None
        count = target.elements[0].value
        if not isinstance(count, cst.Name):
            return None
        indexed = any(
            is_name(name, count.value)
            for subscript in find(loop.body, cst.Subscript)
            for element in subscript.slice
            for name in find(element.slice, cst.Name)
        )
        iterable, depth = loop.iter, 0
        index = self.script.index
        while indexed and index is not None and isinstance(iterable, cst.Call) and iterable.args:
            if "builtins.enumerate" in index.qualified_names(iterable.func):
                return depth
            iterable, depth = iterable.args[0].value, depth + 1
        return None

    def _is_shared(self, expression: cst.BaseExpression) -> bool:
        return isinstance(expression, cst.Call) and code_of(expression.func) == SHARDED_BATCHES

    def _sole_assignment(self, batches: cst.BaseExpression) -> cst.Assign | None:
        """`batches = ...`, when it is a plain name that its scope binds once, so."""
        if not isinstance(batches, cst.Name):
            return None
        scope = self.scope_of(batches)
        region = scope.body if scope is not None else self.tree
        binds = [
            node
            for node in find(region, (cst.Assign, cst.AugAssign, cst.AnnAssign, cst.For))
            if self.scope_of(node) is scope and batches.value in self._binds(node)
        ]
        if len(binds) == 1 and isinstance(binds[0], cst.Assign) and len(binds[0].targets) == 1:
            return binds[0]
        return None

    @staticmethod
    def _binds(node: cst.CSTNode) -> set[str | None]:
        if isinstance(node, cst.Assign):
            return {name_key(t.target) for t in node.targets}
        if isinstance(node, cst.For):
            return {name_key(n) for n in find(node.target, cst.Name)}
        return {name_key(node.target)}  # type: ignore[attr-defined]

    def _only_iterated(self, batches: cst.Name) -> bool:
        """Whether every read of `batches` in its scope is a loop this step shares out or
        the argument of `len()`: then the name itself may hold this process's share."""
        scope = self.scope_of(batches)
        region = scope.body if scope is not None else self.tree
        index = self.script.index
        assert index is not None
        shared = {shared_batches(s.node, index)[0] for s in self.shared}  # type: ignore[arg-type]
        lengths = {call.args[0].value for call in _len_calls(region, index)}
        not_reads = {n for t in find(region, cst.AssignTarget) for n in find(t, cst.Name)}
        not_reads |= {a.attr for a in find(region, cst.Attribute)}
        not_reads |= {a.keyword for a in find(region, cst.Arg) if a.keyword is not None}
        reads = [
            n
            for n in find(region, cst.Name)
            if n.value == batches.value and n not in not_reads and self.scope_of(n) is scope
        ]
        return all(n in shared or n in lengths for n in reads)

    def edited(self) -> list[cst.CSTNode]:
        return [*self.loops, *self.assignments, *self.lengths]

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.Call:
        if original_node not in self.lengths:
            return updated_node
        return updated_node.with_changes(
            args=[updated_node.args[0].with_changes(value=_wrapped(updated_node.args[0].value, 0))]
        )

    def leave_For(self, original_node: cst.For, updated_node: cst.For) -> cst.For:
        depth = self.loops.get(original_node)
        if depth is None:
            return updated_node
        return updated_node.with_changes(iter=_wrapped(updated_node.iter, depth))

    def leave_Assign(self, original_node: cst.Assign, updated_node: cst.Assign) -> cst.Assign:
        if original_node not in self.assignments:
            return updated_node
        return updated_node.with_changes(value=_wrapped(updated_node.value, 0))


def _unwrapped(iterable: cst.BaseExpression, depth: int) -> cst.BaseExpression:
    """What `depth` calls down the first arguments of `iterable` is."""
    for _ in range(depth):
        assert isinstance(iterable, cst.Call)
        iterable = iterable.args[0].value
    return iterable


def _len_calls(region: cst.CSTNode, index: ModuleIndex) -> list[cst.Call]:
    """The `len(x)` calls of `region`."""
    return [
        call
        for call in find(region, cst.Call)
        if index.qualified_names(call.func) == {"builtins.len"} and len(call.args) == 1
    ]


def _wrapped(iterable: cst.BaseExpression, depth: int) -> cst.BaseExpression:
    """`iterable` with what its `depth` pass-through calls wrap inside `ShardedBatches()`."""
    if depth == 0:
        return cst.Call(cst.Name(SHARDED_BATCHES), [cst.Arg(iterable)])
    assert isinstance(iterable, cst.Call)
    first, *rest = iterable.args
    inner = first.with_changes(value=_wrapped(first.value, depth - 1))
    return iterable.with_changes(args=[inner, *rest])
