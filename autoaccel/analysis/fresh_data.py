"""Training steps that draw new random batches every step instead of reading a dataset
(pytorch/examples' regression: `batch_x, batch_y = get_batch()` samples `torch.randn`).

Such a loop needs no sampler under DDP: every process draws its own batches from its
own random stream (re-seeded with its rank, or unseeded), which is what sharding gives a
dataset. A loop that also slices a fixed tensor by its counter (`data[i:i + 16]`) reads
a dataset and is not one of them.
"""

from __future__ import annotations

import libcst as cst

from autoaccel.analysis.names import name_key
from autoaccel.analysis.shapes import bound_names, find, is_method_call
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


def draws_fresh_batches(step: StepLoop) -> bool:
    """Whether each iteration of `step` draws its data from torch's global generator
    and slices no tensor by a loop counter or a parameter of the functions it calls."""
    if step.module is None:
        return False
    places = [(step.node.body, step.module, set(_loop_names(step.node)))]
    places += [
        (f.node.body, f.module, set(f.positional) - {"self"}) for f in step.reached
        if not (f.cls and f.cls.is_module)
    ]
    draws = False
    for body, module, counters in places:
        for call in find(body, cst.Call):
            names = module.index.qualified_names(call.func)
            if names & RANDOM_DRAWS or is_method_call(call, *_IN_PLACE_DRAWS):
                draws = draws or keyword_value(call, "generator") is None
        if any(_slices_by(subscript, counters) for subscript in find(body, cst.Subscript)):
            return False
    return draws


def _loop_names(loop: cst.For | cst.While) -> list[str]:
    return bound_names(loop.target) if isinstance(loop, cst.For) else []


def _slices_by(subscript: cst.Subscript, counters: set[str]) -> bool:
    """`data[i:i + n]` or `data[i]` with `i` one of `counters`."""
    return any(
        name_key(name) in counters
        for element in subscript.slice
        for name in find(element.slice, cst.Name)
    )
