"""How a training loss reduces over the batch: a sum, a mean, or a mix the tool cannot
scale (`Reduction`).

DDP averages gradients over processes. A mean over each process's share averages to the
mean over the whole batch, as before; a sum over each share averages to 1/WORLD_SIZE of
the sum over the whole batch, so it must be multiplied back. The answer follows the
loss through the assignments of its scope and the `return` of the project's functions
(`loss = loss_function(recon, x, mu, logvar)` with pytorch/examples' VAE:
`BCE(..., reduction="sum") + -0.5 * torch.sum(...)` is a sum).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum
from functools import lru_cache

import libcst as cst

from autoaccel.analysis.index import children, descendants
from autoaccel.analysis.program import Kind, SourceModule
from autoaccel.analysis.script_model import ScriptModel
from autoaccel.analysis.shapes import find, is_attribute, is_false, is_method_call, is_name
from autoaccel.cst_edit import keyword_value


class Reduction(Enum):
    NONE = "none"  # no loss reduction in sight (a constant, a model output)
    MEAN = "mean"
    SUM = "sum"
    MIXED = "mixed"  # a sum combined in a way that is neither a sum nor a mean

    def plus(self, other: Reduction) -> Reduction:
        """The reduction of `a + b` (or `a - b`)."""
        if self is other:
            return self
        if Reduction.SUM in (self, other) or Reduction.MIXED in (self, other):
            return Reduction.MIXED
        return Reduction.MEAN  # a mean plus a constant (a regulariser) stays a mean


SUMS = frozenset({"torch.sum"})
MEANS = frozenset({"torch.mean"})


class LossReductions:
    """Classifies the loss expressions of one module of a program."""

    def __init__(self, script: ScriptModel) -> None:
        self.script = script

    def of(self, node: cst.BaseExpression, scope: cst.CSTNode) -> Reduction:
        """The reduction of `node`, an expression of the script read in `scope` (the
        function or module that holds it)."""
        assert self.script.module is not None
        return self._of(node, _Place(scope, self.script.module), frozenset())

    def _of(self, node: cst.BaseExpression, place: _Place, seen: frozenset) -> Reduction:
        if isinstance(node, cst.Name):
            key = (node.value, id(place.scope))
            if key in seen:
                return Reduction.NONE
            result: Reduction | None = None
            for value in assigned_values(place.scope, node.value):
                if isinstance(value, (cst.Integer, cst.Float)):
                    continue  # `loss = 0` before `loss += ...`
                kind = self._of(value, place, seen | {key})
                result = kind if result is None else result.plus(kind)
            return result or Reduction.NONE
        if isinstance(node, cst.UnaryOperation):
            return self._of(node.expression, place, seen)
        if isinstance(node, cst.BinaryOperation):
            return self._binary(node, place, seen)
        if isinstance(node, cst.Call):
            return self._call(node, place, seen)
        return Reduction.NONE

    def _binary(self, node: cst.BinaryOperation, place: _Place, seen: frozenset) -> Reduction:
        if isinstance(node.operator, cst.Divide):
            return self._divided(node.left, node.right, place, seen)
        left, right = self._of(node.left, place, seen), self._of(node.right, place, seen)
        if isinstance(node.operator, (cst.Add, cst.Subtract)):
            return left.plus(right)
        if isinstance(node.operator, cst.Multiply):
            if Reduction.NONE in (left, right):
                return right if left is Reduction.NONE else left  # a constant factor
            return Reduction.MIXED
        return Reduction.NONE if left is right is Reduction.NONE else Reduction.MIXED

    def _divided(
        self,
        dividend: cst.BaseExpression,
        divisor: cst.BaseExpression,
        place: _Place,
        seen: frozenset,
    ) -> Reduction:
        """`dividend / divisor`: a sum divided by the size of the batch it sums over is a
        mean of this process's share; divided by anything else (a constant, the size of
        the dataset) it stays a scaled sum the tool does not scale."""
        left, right = self._of(dividend, place, seen), self._of(divisor, place, seen)
        if right is not Reduction.NONE:
            return Reduction.MIXED
        if left is Reduction.SUM:
            return Reduction.MEAN if _counts(divisor, dividend, place) else Reduction.MIXED
        return left

    def _call(self, node: cst.Call, place: _Place, seen: frozenset) -> Reduction:
        names = place.module.index.qualified_names(node.func)
        if sums_by_keyword(node) or self._calls_summing_module(node, place):
            return Reduction.SUM
        if names & SUMS or is_method_call(node, "sum"):
            everything = _reduces_everything(node, positional=1 if names & SUMS else 0)
            return Reduction.SUM if everything else Reduction.MIXED
        if names & MEANS or is_method_call(node, "mean"):
            return Reduction.MEAN
        if is_method_call(node, "div") and len(node.args) == 1:  # `bce.div(batch_size)`
            dividend = node.func.value  # type: ignore[attr-defined]
            return self._divided(dividend, node.args[0].value, place, seen)
        functions = self.script.program.callees.get(node, set()) if self.script.program else set()
        returned = [
            (value, _Place(f.node, f.module))
            for f in functions
            if not (f.cls and f.cls.is_module)
            for value in returned_values(f.node)
        ]
        if returned:
            result = self._of(returned[0][0], returned[0][1], seen)
            for value, where in returned[1:]:
                result = result.plus(self._of(value, where, seen))
            return result
        inner = [self._of(a.value, place, seen) for a in node.args]
        if is_method_call(node):
            inner.append(self._of(node.func.value, place, seen))  # type: ignore[attr-defined]
        if Reduction.SUM in inner or Reduction.MIXED in inner:
            return Reduction.MIXED
        return Reduction.MEAN if Reduction.MEAN in inner else Reduction.NONE

    def _calls_summing_module(self, node: cst.Call, place: _Place) -> bool:
        """`criterion(...)` where `criterion = nn.MSELoss(reduction="sum")`."""
        if self.script.program is None:
            return False
        return any(
            obj.kind is Kind.CRITERION
            and isinstance(obj.node, cst.Call)
            and sums_by_keyword(obj.node)
            for obj in self.script.program.values_of(node.func, place.module)
        )


@dataclass(frozen=True)
class _Place:
    scope: cst.CSTNode  # a function or module
    module: SourceModule


def sums_by_keyword(call: cst.Call) -> bool:
    """`reduction="sum"` or legacy `size_average=False` among the call's keywords."""
    reduction = keyword_value(call, "reduction")
    if isinstance(reduction, cst.SimpleString) and reduction.evaluated_value == "sum":
        return True
    return is_false(keyword_value(call, "size_average"))


def _reduces_everything(call: cst.Call, positional: int) -> bool:
    """`t.sum()` / `torch.sum(t)` (`positional`: 0 or 1 tensor argument): no `dim`, so
    the batch is summed too."""
    given = [a for a in call.args if a.keyword is None]
    return len(given) <= positional and keyword_value(call, "dim") is None


def is_batch_size(node: cst.BaseExpression) -> bool:
    """A count of samples: `len(x)`, `x.size(0)`, `x.shape[0]`."""
    return _measured(node) is not None


def _measured(node: cst.BaseExpression) -> cst.BaseExpression | None:
    """`x` in `len(x)`, `x.size(0)`, `x.shape[0]`."""
    if isinstance(node, cst.Call) and is_name(node.func, "len") and len(node.args) == 1:
        return node.args[0].value
    if is_method_call(node, "size"):
        args = node.args  # type: ignore[attr-defined]
        if len(args) == 1 and isinstance(args[0].value, cst.Integer) and args[0].value.value == "0":
            return node.func.value  # type: ignore[attr-defined]
    if isinstance(node, cst.Subscript) and is_attribute(node.value, "shape"):
        index = node.slice[0].slice if len(node.slice) == 1 else None
        if (
            isinstance(index, cst.Index)
            and isinstance(index.value, cst.Integer)
            and index.value.value == "0"
        ):
            return node.value.value  # type: ignore[attr-defined]
    return None


def _counts(divisor: cst.BaseExpression, dividend: cst.BaseExpression, place: _Place) -> bool:
    """`divisor` counts the samples `dividend` sums over: the size of a tensor the
    dividend is computed from (`bce / x.size(0)`, `bce.div(batch_size)` after
    `batch_size = len(x)`), not of the dataset or a constant."""
    sizes = [divisor]
    if isinstance(divisor, cst.Name):
        sizes = assigned_values(place.scope, divisor.value)
    measured = [_measured(size) for size in sizes]
    return bool(measured) and all(
        tensor is not None and _reads(dividend, tensor, place.scope, frozenset())
        for tensor in measured
    )


def _reads(
    expression: cst.BaseExpression, tensor: cst.BaseExpression, scope: cst.CSTNode, seen: frozenset
) -> bool:
    """Whether `expression` is computed from `tensor`: it holds it, or a name it reads
    is assigned from it in `scope`."""
    labels = {id(n.attr) for n in find(expression, cst.Attribute)}  # `.size`, `reduction=`
    labels |= {id(n.keyword) for n in find(expression, cst.Arg) if n.keyword is not None}
    for node in descendants(expression):
        if id(node) in labels:
            continue
        if node.deep_equals(tensor):
            return True
        if isinstance(node, cst.Name) and node.value not in seen:
            if any(
                _reads(value, tensor, scope, seen | {node.value})
                for value in assigned_values(scope, node.value)
            ):
                return True
    return False


def assigned_values(scope: cst.CSTNode, name: str) -> list[cst.BaseExpression]:
    """The values `scope` (a function or module, not its nested functions) assigns to
    `name`: `name = v`, `name, other = v, w`, `name += v`, `name: T = v`."""
    return list(_assignments(scope).get(name, ()))


@lru_cache(maxsize=256)
def _assignments(scope: cst.CSTNode) -> dict[str, list[cst.BaseExpression]]:
    """Every name `scope` assigns, with its values, from one walk (a sum's name is looked
    up in each step of the conversion)."""
    found: dict[str, list[cst.BaseExpression]] = {}
    for node in _own_nodes(scope):
        if isinstance(node, cst.Assign):
            for target in (t.target for t in node.targets):
                if isinstance(target, cst.Name):
                    found.setdefault(target.value, []).append(node.value)
                elif isinstance(target, cst.Tuple) and isinstance(node.value, cst.Tuple):
                    for t, v in zip(target.elements, node.value.elements):  # `total, seen = 0.0, 0`
                        if isinstance(t.value, cst.Name):
                            found.setdefault(t.value.value, []).append(v.value)
        elif isinstance(node, (cst.AugAssign, cst.AnnAssign)):
            if isinstance(node.target, cst.Name) and node.value is not None:
                found.setdefault(node.target.value, []).append(node.value)
    return found


def _own_nodes(scope: cst.CSTNode) -> Iterable[cst.CSTNode]:
    """The nodes of `scope`, without those of functions and classes defined in it."""
    stack = children(scope)[::-1] if isinstance(scope, cst.Module) else [scope.body]  # type: ignore[attr-defined]
    while stack:
        node = stack.pop()
        if isinstance(node, (cst.FunctionDef, cst.ClassDef, cst.Lambda)):
            continue
        yield node
        stack.extend(children(node)[::-1])


def returned_values(function: cst.FunctionDef) -> list[cst.BaseExpression]:
    """The values `function`'s own `return` statements give."""
    return [
        n.value for n in _own_nodes(function) if isinstance(n, cst.Return) and n.value is not None
    ]
