"""Training steps that draw new random batches every step instead of reading a dataset
(pytorch/examples' regression: `batch_x, batch_y = get_batch()` samples `torch.randn`; a
DQN's `random.sample(replay_buffer, 32)`; a char-RNN's `random.randint` chunk offsets).

Such a loop needs no sampler under DDP: every process draws its own batches from its
own random stream (re-seeded with its rank, or unseeded), which is what sharding gives a
dataset. A loop that also indexes a fixed tensor by its counter (`data[i:i + 16]`) reads
a dataset and is not one of them.
"""

from __future__ import annotations

from enum import Enum

import libcst as cst

from autoaccel.analysis.index import ModuleIndex
from autoaccel.analysis.names import name_key
from autoaccel.analysis.program import Program
from autoaccel.analysis.shapes import bound_names, find, is_method_call, is_no_grad_block
from autoaccel.analysis.training import StepLoop
from autoaccel.cst_edit import keyword_value

# torch's samplers that draw from the global generator unless given `generator=`.
RANDOM_DRAWS = frozenset(
    f"torch.{name}"
    for name in (
        "randn", "rand", "randint", "randn_like", "rand_like", "randint_like", "normal",
        "randperm", "bernoulli", "multinomial", "poisson",
    )
)  # fmt: skip
_IN_PLACE_DRAWS = ("normal_", "uniform_", "random_", "bernoulli_", "exponential_")
# Python's and NumPy's global generators, which SeedEachRank leaves to the script.
HOST_DRAWS = frozenset(
    [f"random.{name}" for name in ("random", "randint", "randrange", "choice", "choices", "sample", "shuffle")]
    + [
        f"numpy.random.{name}"
        for name in ("rand", "randn", "randint", "random", "choice", "permutation", "shuffle")
    ]
)  # fmt: skip
HOST_SEEDS = frozenset({"random.seed", "numpy.random.seed"})


class Generator(Enum):
    """The global random stream a batch is drawn from."""

    TORCH = "torch"
    HOST = "Python's or NumPy's"


def fresh_draws(step: StepLoop, program: Program | None = None) -> frozenset[Generator]:
    """The global generators each iteration of `step` draws its data from, when it
    indexes no tensor by a loop counter or a parameter of the functions it calls (empty
    when it reads a dataset, or draws nothing). Code under `torch.no_grad()` is not the
    step's data (former's validation every N batches slices the test set by a counter),
    nor, given the `program`, the functions only it calls."""
    if step.module is None:
        return frozenset()
    evaluation = {
        node
        for block in find(step.node.body, cst.With)
        if is_no_grad_block(block, step.module.index.qualified_names)
        for node in find(block, (cst.Call, cst.Subscript))
    }
    outside = [c for c in find(step.node.body, cst.Call) if c not in evaluation]
    reached = step.reached if program is None else program.reached_by(outside) & set(step.reached)
    places = [(step.node.body, step.module, set(_loop_names(step.node)))]
    places += [
        (f.node.body, f.module, set(f.positional) - {"self"})
        for f in reached
        if not (f.cls and f.cls.is_module)
    ]
    drawn: set[Generator | None] = set()
    for body, module, counters in places:
        calls = [c for c in find(body, cst.Call) if c not in evaluation]
        drawn.update(generator_of(call, module.index) for call in calls)
        subscripts = [s for s in find(body, cst.Subscript) if s not in evaluation]
        if any(_indexes_by(subscript, counters) for subscript in subscripts):
            return frozenset()
    return frozenset(drawn - {None})  # type: ignore[arg-type]


def generator_of(call: cst.Call, index: ModuleIndex) -> Generator | None:
    """The global generator `call` draws from, if it draws from one."""
    names = index.qualified_names(call.func)
    torch_draw = names & RANDOM_DRAWS or is_method_call(call, *_IN_PLACE_DRAWS)
    if torch_draw and keyword_value(call, "generator") is None:
        return Generator.TORCH
    return Generator.HOST if names & HOST_DRAWS else None


def _loop_names(loop: cst.For | cst.While) -> list[str]:
    return bound_names(loop.target) if isinstance(loop, cst.For) else []


def _indexes_by(subscript: cst.Subscript, counters: set[str]) -> bool:
    """`data[i:i + n]` or `data[i]` with `i` one of `counters` (where a slice starts, not
    how long it is: `text[start:start + chunk_len]` starts at a random offset)."""
    return any(
        name_key(name) in counters
        for element in subscript.slice
        for start in [
            element.slice.lower if isinstance(element.slice, cst.Slice) else element.slice
        ]
        if start is not None
        for name in find(start, cst.Name)
    )
