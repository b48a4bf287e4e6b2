"""Each process trains on its own rows of tensors that a `torch.randperm` cuts into batches.

Older time-series and tabular scripts batch by hand (LSTNet's `get_batches`):

    def get_batches(inputs, targets, batch_size, shuffle=True):
        index = torch.randperm(len(inputs)) if shuffle else torch.arange(len(inputs))
        for start in range(0, len(inputs), batch_size):
            excerpt = index[start:start + batch_size]
            yield inputs[excerpt], targets[excerpt]

    for x, y in get_batches(train_x, train_y, args.batch_size, True): ...

The training loop's call passes this process's rows, `shard_rows(train_x)`: every
WORLD_SIZE-th from its RANK, as many on every process, so that all take as many steps. Each
process shuffles its own rows (it is re-seeded with its rank), and loads
`per_process_batch_size(args.batch_size)` of them, so that the global batch stays
(`--per-process-batch` keeps the batch per process). Evaluation calls keep whole tensors.
What the step cannot prove (the batch maker reads other data or mutates its rows, the
permutation's length comes from elsewhere, a literal batch size, rows rebuilt in the loop,
a loop that trains only under a condition) is refused with its line.
"""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from autoaccel.analysis.names import name_key
from autoaccel.analysis.permuted_rows import (
    PermutedBatches,
    permutation_cuts,
    permuted_batches,
    randperm_calls,
)
from autoaccel.analysis.program import FunctionInfo
from autoaccel.analysis.script_model import ScriptModel
from autoaccel.analysis.shapes import bound_names, find, is_name
from autoaccel.analysis.training import StepLoop
from autoaccel.convert.transforms.distributed._base import RANK, WORLD_SIZE, DistributedStep
from autoaccel.convert.transforms.distributed.shard_train_loader import (
    BATCH_HELPER,
    BATCH_HELPER_CODE,
)
from autoaccel.cst_edit import code_of

SHARD_ROWS = "shard_rows"
_SHARD_ROWS_CODE = f'''
def {SHARD_ROWS}(rows):
    """This process's rows: every {WORLD_SIZE}-th from its {RANK}, as many on every process
    (the last `len(rows) % {WORLD_SIZE}` are left out), so that all take as many steps."""
    return rows[{RANK} : len(rows) - len(rows) % {WORLD_SIZE} : {WORLD_SIZE}]
'''
_REFUSED = "each process's rows"


def _reads(node: cst.CSTNode) -> set[str]:
    """The plain names `node` reads (not the attribute names of `x.size`)."""
    attributes = {a.attr for a in find(node, cst.Attribute)}
    return {name.value for name in find(node, cst.Name) if name not in attributes}


def _depends_on(function: FunctionInfo, roots: set[str]) -> set[str]:
    """The names that `roots` are computed from in `function` (through its assignments,
    `+=` updates and `for` targets) and that it does not bind: parameters, globals and
    builtins."""
    sources: dict[str, set[str]] = {}
    body = function.node.body
    bindings = [(t.target, a.value) for a in find(body, cst.Assign) for t in a.targets]
    bindings += [(a.target, a.value) for a in find(body, cst.AugAssign)]
    bindings += [(loop.target, loop.iter) for loop in find(body, cst.For)]
    for target, value in bindings:
        for name in bound_names(target):
            sources.setdefault(name, set()).update(_reads(value))
    found, todo = set(), list(roots)
    while todo:
        name = todo.pop()
        if name not in found:
            found.add(name)
            todo += sources.get(name, ())
    return found - sources.keys()


class ShardPermutedRows(DistributedStep):
    DESCRIPTION = "Give each process its own rows of tensors a torch.randperm cuts into batches."

    def visit_Module(self, node: cst.Module) -> None:
        self.arguments: dict[cst.Arg, str] = {}  # an argument -> the helper that wraps it
        for loop in self.train_loops():
            step = self.script.step_loops[loop]
            if step.loaders or (found := permuted_batches(step, self.script)) is None:
                continue
            reason = self._plan(step, found)
            if reason is not None:
                self.skipped(
                    _REFUSED,
                    f"this training loop takes its batches from `{code_of(found.call.func)}()`,"
                    f" which cuts a `torch.randperm` of its rows into batches, but {reason}: every"
                    " process would train on all of the rows; give each process its share by hand"
                    f" (the rows `[{RANK}::{WORLD_SIZE}]` of what it batches, and a per-process batch)",
                    found.call,
                    wrong=True,
                )
        if SHARD_ROWS in self.arguments.values():
            self.define_helper(node, SHARD_ROWS, _SHARD_ROWS_CODE)
        if BATCH_HELPER in self.arguments.values():
            self.define_helper(node, BATCH_HELPER, BATCH_HELPER_CODE)
            self.imports.append("import warnings")

    def _plan(self, step: StepLoop, found: PermutedBatches) -> str | None:
        """Plan the call's rows and batch size per process; why not, if it cannot."""
        function, call = found.function, found.call
        cut = _rows_and_batch(function)
        if isinstance(cut, str):
            return cut
        rows, batch = cut
        arguments = _arguments(call, function)
        if arguments is None or not all(p in arguments for p in (*rows, batch)):
            return "the call does not pass each of its rows and its batch size"
        rebuilt = {n for t in find(step.node.body, cst.AssignTarget) for n in bound_names(t.target)}
        if any(_reads(arguments[row].value) & rebuilt for row in rows):
            return "the loop rebuilds the rows it batches"
        if any(
            isinstance(a, cst.If)
            for b in _backward_calls(step, self.script)
            for a in self.ancestors(b)
        ):
            return "the loop trains only under a condition (it may evaluate too)"
        size = arguments[batch]
        if all(_wrapped(arguments[row].value, SHARD_ROWS) for row in rows):
            return None  # converted already
        if not m.matches(size.value, m.Name() | m.Attribute()):
            return f"its batch size `{code_of(size.value)}` is not a variable"
        for row in sorted(rows):
            self.arguments[arguments[row]] = SHARD_ROWS
        if not self.options.per_process_batch:
            self.arguments[size] = BATCH_HELPER
        self.changed(
            call,
            f"each process batches its own rows (`{SHARD_ROWS}()`: every {WORLD_SIZE}-th from its"
            f" {RANK}, as many on each) in its own random order"
            + (
                ""
                if self.options.per_process_batch
                else f"; per-process batch = global batch // {WORLD_SIZE}"
            ),
        )
        return None

    def edited(self) -> list[cst.CSTNode]:
        return [*self.planned_statements(), *self.arguments]

    def leave_Arg(self, original_node: cst.Arg, updated_node: cst.Arg) -> cst.Arg:
        helper = self.arguments.get(original_node)
        if helper is None:
            return updated_node
        return updated_node.with_changes(
            value=cst.Call(cst.Name(helper), [cst.Arg(updated_node.value)])
        )


def _rows_and_batch(function: FunctionInfo) -> tuple[set[str], str] | str:
    """The parameters of `function` whose rows it cuts by slices of a permutation of them,
    and the one it cuts by (the batch size); why not, if that cannot be shown."""
    cuts = permutation_cuts(function)
    excerpts = {
        name
        for assign in find(function.node.body, cst.Assign)
        if assign.value in cuts
        for target in assign.targets
        for name in bound_names(target.target)
    }
    indexed = [
        subscript
        for subscript in find(function.node.body, cst.Subscript)
        if len(subscript.slice) == 1
        and isinstance(index := subscript.slice[0].slice, cst.Index)
        and (is_name(index.value, *excerpts) or index.value in cuts)
    ]
    params = set(function.positional) - {"self"}
    if not indexed or not {name_key(s.value) for s in indexed} <= params:
        return "it indexes data that the call does not pass"
    rows = {code_of(s.value) for s in indexed}  # parameters, as shown
    if _mutated(function, rows):
        return "it changes the rows it is passed"
    lengths = [a.value for c in randperm_calls(function) for a in c.args]
    length = _depends_on(function, {n for a in lengths for n in _reads(a)})
    if not length & rows or length - rows - {"len"}:
        return "the permutation's length does not come from the rows alone"
    sizes = _depends_on(function, {n for cut in cuts for n in _reads(cut.slice[0])})
    batch = (sizes & params) - rows
    if len(batch) != 1:
        return "the batch size it cuts by is not one of its parameters"
    return rows, batch.pop()


def _arguments(call: cst.Call, function: FunctionInfo) -> dict[str, cst.Arg] | None:
    """`function`'s parameters that `call` passes, with their arguments (None: `*args`)."""
    if any(a.star for a in call.args):
        return None
    params = function.positional
    if function.is_method and isinstance(call.func, cst.Attribute):
        params = params[1:]
    positional = [a for a in call.args if a.keyword is None]
    arguments = dict(zip(params, positional))
    arguments.update({a.keyword.value: a for a in call.args if a.keyword is not None})
    return arguments


def _mutated(function: FunctionInfo, rows: set[str]) -> bool:
    """Whether `function` rebinds or writes into a name of `rows`, or changes one in place."""
    body = function.node.body
    targets = [t.target for t in find(body, cst.AssignTarget)]
    targets += [a.target for a in find(body, cst.AugAssign)]
    written = {n.value for t in targets for n in find(t, cst.Name)}
    in_place = {
        name_key(c.func.value)
        for c in find(body, cst.Call)
        if isinstance(c.func, cst.Attribute) and c.func.attr.value.endswith("_")
    }
    return bool(rows & (written | in_place))


def _backward_calls(step: StepLoop, script: ScriptModel) -> list[cst.Call]:
    """The `.backward()` calls of this module in the loop."""
    return [c for c in script.training.backward_calls if c in find(step.node.body, cst.Call)]


def _wrapped(value: cst.BaseExpression, helper: str) -> bool:
    return isinstance(value, cst.Call) and is_name(value.func, helper)
