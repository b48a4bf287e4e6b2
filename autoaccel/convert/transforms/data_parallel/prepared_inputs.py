"""A batch input that the forward pass moves to the device, or makes a tensor of, is
moved before the wrapped call.

`out = model(x.to(device))` inside the function `nn.DataParallel` runs on every GPU
would move each GPU's part of the batch to `device` (`cuda:0`) again, beside a replica
on another GPU; and `torch.from_numpy(X)` there would get the whole NumPy batch on every
GPU: DataParallel splits tensors only (DA-RNN, the tenth unseen set). So where every read
of an input in those lines is the same such expression, the expression is computed before
the call and passed in its place (`loss_on_gpus(x.to(device), y.to(device))`), and the
lines read the input as it arrives, on its GPU (`out = model(x)`). A NumPy input read
otherwise is refused.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import libcst as cst

from autoaccel.analysis.shapes import find

# Methods that convert a tensor or move it, keeping its shape.
_CONVERSIONS = frozenset(
    {"to", "cuda", "type", "float", "double", "half", "bfloat16", "long", "int", "bool"}
)
_MOVES = frozenset({"to", "cuda", "type"})
# Calls that make a tensor of their first argument (a NumPy array, a list).
_TENSOR_MAKERS = frozenset(
    {
        "torch.from_numpy",
        "torch.as_tensor",
        "torch.tensor",
        "torch.Tensor",
        "torch.FloatTensor",
        "torch.LongTensor",
        "torch.autograd.Variable",
        "torch.autograd.variable.Variable",
    }
)


class Prepared:
    """The inputs passed as their prepared expressions: `codes` by input name, and the
    nodes of the moved lines that become the input's name."""

    def __init__(self) -> None:
        self.codes: dict[str, cst.BaseExpression] = {}
        self.nodes: dict[cst.CSTNode, str] = {}


def prepared_inputs(
    lines: Iterable[cst.CSTNode],
    inputs: list[str],
    defined: set[str],
    parent: Callable[[cst.CSTNode], cst.CSTNode | None],
    qualified_names: Callable[[cst.CSTNode], frozenset[str]],
) -> tuple[Prepared, str | None]:
    """The inputs of `lines` to prepare before the call (an expression that reads no name
    `defined` in the lines), and the name of a NumPy input that cannot be (None when
    there is none)."""
    prepared = Prepared()
    reads: dict[str, list[cst.Name]] = {name: [] for name in inputs}
    for line in lines:
        for node in find(line, cst.Name):
            if node.value in reads and _is_read(node, parent):
                reads[node.value].append(node)
    for name, found in reads.items():
        preparations = [_climb(node, parent, qualified_names) for node in found]
        if not preparations:
            continue
        first = preparations[0]
        alike = all(p.deep_equals(first) for p in preparations)
        local = any(n.value in defined for n in find(first, cst.Name))
        if (
            alike
            and not local
            and any(_prepares(call, qualified_names) for call in find(first, cst.Call))
        ):
            prepared.codes[name] = first
            prepared.nodes.update(dict.fromkeys(preparations, name))
        elif any(
            qualified_names(call.func) & _TENSOR_MAKERS
            for p in preparations
            for call in find(p, cst.Call)
        ):
            return prepared, name
    return prepared, None


def _is_read(node: cst.Name, parent: Callable[[cst.CSTNode], cst.CSTNode | None]) -> bool:
    """Not the `attr` of an attribute, nor a keyword's name."""
    above = parent(node)
    if isinstance(above, cst.Attribute) and above.attr is node:
        return False
    return not (isinstance(above, cst.Arg) and above.keyword is node)


def _climb(
    node: cst.BaseExpression,
    parent: Callable[[cst.CSTNode], cst.CSTNode | None],
    qualified_names: Callable[[cst.CSTNode], frozenset[str]],
) -> cst.BaseExpression:
    """The largest expression around `node` that only converts or moves it:
    `torch.from_numpy(X).type(torch.FloatTensor).to(self.device)` around `X`."""
    while True:
        above = parent(node)
        call = parent(above) if above is not None else None
        if (
            isinstance(above, cst.Attribute)
            and above.value is node
            and above.attr.value in _CONVERSIONS
            and isinstance(call, cst.Call)
            and call.func is above
        ):
            node = call
        elif (
            isinstance(above, cst.Arg)
            and above.keyword is None
            and isinstance(call, cst.Call)
            and call.args[0] is above
            and qualified_names(call.func) & _TENSOR_MAKERS
        ):
            node = call
        else:
            return node


def _prepares(call: cst.Call, qualified_names: Callable[[cst.CSTNode], frozenset[str]]) -> bool:
    """A move to a device, or a tensor made of something else."""
    moves = isinstance(call.func, cst.Attribute) and call.func.attr.value in _MOVES
    return moves or bool(qualified_names(call.func) & _TENSOR_MAKERS)
