"""How a training loss reduces over the batch: a sum, a mean, or a mix the tool cannot
scale (`Reduction`).

DDP averages gradients over processes. A mean over each process's share averages to the
mean over the whole batch, as before; a sum over each share averages to 1/WORLD_SIZE of
the sum over the whole batch, so it must be multiplied back; a mean divided again by the
batch's size grows as the share shrinks. The answer follows the loss through the
assignments of its scope that reach each read (`loss = loss / n` after an `if` that binds
`loss` in each branch) and the `return` of the project's functions
(`loss = loss_function(recon, x, mu, logvar)` with pytorch/examples' VAE:
`BCE(..., reduction="sum") + -0.5 * torch.sum(...)` is a sum).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum
from functools import lru_cache

import libcst as cst

from autoaccel.analysis.index import ModuleIndex, children, descendants
from autoaccel.analysis.losses import is_functional_loss
from autoaccel.analysis.program import Kind, SourceModule
from autoaccel.analysis.script_model import ScriptModel
from autoaccel.analysis.shapes import find, is_attribute, is_false, is_method_call, is_name
from autoaccel.cst_edit import keyword_value


class Reduction(Enum):
    NONE = "none"  # no loss reduction in sight (a constant, a model output)
    MEAN = "mean"
    SUM = "sum"
    # a sum over the batch divided by another (a Dice loss): free of the batch's size, as a
    # mean is, but not the mean of its parts' ratios
    RATIO = "ratio of sums"
    SCALED = "scaled"  # a sum divided by a number not known to count its samples (`/ 255`)
    OVER_BATCH = "mean / batch size"  # a mean divided again by its batch's size
    MIXED = "mixed"  # one of those combined with other terms
    EITHER = "either"  # one of several values, reduced differently: the branch that runs decides

    def plus(self, other: Reduction) -> Reduction:
        """The reduction of `a + b` (or `a - b`), or of a name bound to `a` or `b`."""
        pair = {self, other}
        if len(pair) == 1:
            return self
        if pair == {Reduction.SUM, Reduction.SCALED}:
            return Reduction.SCALED  # a weighted sum
        if Reduction.NONE in pair and pair & {Reduction.MEAN, Reduction.RATIO}:
            return (pair - {Reduction.NONE}).pop()  # plus a constant (a regulariser): the same
        if pair == {Reduction.MEAN, Reduction.RATIO}:
            return Reduction.RATIO  # free of the batch's size, as both terms are
        return Reduction.MIXED

    def either(self, other: Reduction) -> Reduction:
        """The reduction of a name bound to `a` in one branch and `b` in another (or of a
        function that returns either)."""
        if self is Reduction.MIXED or other is Reduction.MIXED:
            return Reduction.MIXED
        combined = self.plus(other)
        return Reduction.EITHER if combined is Reduction.MIXED else combined


# What a name is bound to: an expression, or the statement `name /= v` itself.
Value = cst.BaseExpression | cst.AugAssign
SUMS = frozenset({"torch.sum"})
MEANS = frozenset({"torch.mean"})


class LossReductions:
    """Classifies the loss expressions of one module of a program."""

    def __init__(self, script: ScriptModel) -> None:
        self.script = script
        # the divisors that made the last loss classified `OVER_BATCH`, with their modules
        self.batch_divisors: list[tuple[cst.BaseExpression, SourceModule]] = []

    def of(self, node: cst.BaseExpression, scope: cst.CSTNode) -> Reduction:
        """The reduction of `node`, an expression of the script read in `scope` (the
        function or module that holds it)."""
        assert self.script.module is not None
        self.batch_divisors = []
        return self._of(node, _Place(scope, self.script.module), frozenset())

    def _of(self, node: Value, place: _Place, seen: frozenset) -> Reduction:
        if isinstance(node, cst.Name):
            result: Reduction | None = None
            for value in reaching_values(node, place.scope, place.module.index):
                if isinstance(value, (cst.Integer, cst.Float)) or id(value) in seen:
                    continue  # `loss = 0` before `loss += ...`; `loss = loss + x` in a loop
                kind = self._of(value, place, seen | {id(value)})
                result = kind if result is None else result.either(kind)
            return result or Reduction.NONE
        if isinstance(node, cst.UnaryOperation):
            return self._of(node.expression, place, seen)
        if isinstance(node, (cst.BinaryOperation, cst.AugAssign)):  # `loss /= n`
            left = node.left if isinstance(node, cst.BinaryOperation) else node.target
            right = node.right if isinstance(node, cst.BinaryOperation) else node.value
            return self._binary(left, node.operator, right, place, seen)
        if isinstance(node, cst.Call):
            return self._call(node, place, seen)
        return Reduction.NONE

    def _binary(
        self,
        left_node: cst.BaseExpression,
        operator: cst.CSTNode,
        right_node: cst.BaseExpression,
        place: _Place,
        seen: frozenset,
    ) -> Reduction:
        if isinstance(operator, (cst.Divide, cst.DivideAssign)):
            return self._divided(left_node, right_node, place, seen)
        left, right = self._of(left_node, place, seen), self._of(right_node, place, seen)
        if isinstance(operator, (cst.Add, cst.Subtract)):
            return left.plus(right)
        if isinstance(operator, (cst.Multiply, cst.MultiplyAssign)):
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
        """`dividend / divisor`: a sum (or a scaled one) divided by the size of the batch
        it sums over is a mean of this process's share; divided by anything else (a
        constant, the size of the dataset) it is a scaled sum. A mean divided by its
        batch's size grows as the batch shrinks."""
        if self._sums(dividend, place, seen) and self._sums(divisor, place, seen):
            return Reduction.RATIO  # `(2 * (p * t).sum() + 1) / (p.sum() + t.sum() + 1)`
        left, right = self._of(dividend, place, seen), self._of(divisor, place, seen)
        if right is not Reduction.NONE:
            return Reduction.MIXED
        if left in (Reduction.SUM, Reduction.SCALED):
            return Reduction.MEAN if _counts(divisor, dividend, place) else Reduction.SCALED
        if left is Reduction.MEAN and _counts(divisor, dividend, place):
            self.batch_divisors.append((divisor, place.module))
            return Reduction.OVER_BATCH
        return left

    def _sums(self, node: cst.BaseExpression, place: _Place, seen: frozenset) -> bool:
        """Whether `node` is a sum over the batch, give or take a constant (`p.sum() + 1`)."""
        if isinstance(node, cst.BinaryOperation) and isinstance(
            node.operator, (cst.Add, cst.Subtract)
        ):
            left, right = self._of(node.left, place, seen), self._of(node.right, place, seen)
            if Reduction.NONE in (left, right):
                side = node.right if left is Reduction.NONE else node.left
                return left is not right and self._sums(side, place, seen)
        return self._of(node, place, seen) in (Reduction.SUM, Reduction.SCALED)

    def _call(self, node: cst.Call, place: _Place, seen: frozenset) -> Reduction:
        names = place.module.index.qualified_names(node.func)
        criteria = self._criteria(node, place)
        if sums_by_keyword(node) or any(map(sums_by_keyword, criteria)):
            return Reduction.SUM
        if (criteria or is_functional_loss(names)) and all(
            map(means_by_default, [node, *criteria])
        ):
            return Reduction.MEAN  # `F.cross_entropy(...)`, `criterion(...)`
        if names & SUMS or is_method_call(node, "sum"):
            summed = _reduced(node, torch_function=bool(names & SUMS))
            if summed is not None and self._of(summed, place, seen) is Reduction.MEAN:
                return Reduction.MEAN  # `x.mean(0).sum()`: the sum of a batch mean
            everything = _reduces_everything(node, positional=1 if names & SUMS else 0)
            return Reduction.SUM if everything else Reduction.MIXED
        if names & MEANS or is_method_call(node, "mean"):
            return Reduction.NONE if _per_sample(node, bool(names & MEANS)) else Reduction.MEAN
        if is_method_call(node, "div") and len(node.args) == 1:  # `bce.div(batch_size)`
            dividend = node.func.value  # type: ignore[attr-defined]
            return self._divided(dividend, node.args[0].value, place, seen)
        functions = self.script.program.callees.get(node, set()) if self.script.program else set()
        losses = {o.cls for o in self.script.training.criteria if o.cls is not None}
        returned = [
            (value, _Place(f.node, f.module))
            for f in functions
            if not (f.cls and f.cls.is_module) or f.cls in losses  # a model's forward is no loss
            for value in returned_values(f.node)
        ]
        if returned:
            result = self._of(returned[0][0], returned[0][1], seen)
            for value, where in returned[1:]:
                result = result.either(self._of(value, where, seen))
            return result
        inner = [self._of(a.value, place, seen) for a in node.args]
        if is_method_call(node):
            inner.append(self._of(node.func.value, place, seen))  # type: ignore[attr-defined]
        if {Reduction.SUM, Reduction.SCALED, Reduction.MIXED} & set(inner):
            return Reduction.MIXED
        return Reduction.MEAN if Reduction.MEAN in inner else Reduction.NONE

    def _criteria(self, node: cst.Call, place: _Place) -> list[cst.Call]:
        """The constructor calls of the loss module `node` calls: `nn.MSELoss(...)` for
        `criterion(...)` after `criterion = nn.MSELoss(...)`."""
        if self.script.program is None:
            return []
        return [
            obj.node
            for obj in self.script.program.values_of(node.func, place.module)
            if obj.kind is Kind.CRITERION and isinstance(obj.node, cst.Call)
        ]


def averages_or_sums(script: ScriptModel, call: cst.Call) -> str | None:
    """ "mean" or "sum": how the loss `call` of the script's module reduces its batch, read
    in the function that holds it (a loss class or function of the project: its
    `return`); None for any other reduction (a ratio of sums, a mix)."""
    assert script.index is not None
    found = LossReductions(script).of(call, script.index.scope_of(call))
    return {Reduction.MEAN: "mean", Reduction.SUM: "sum"}.get(found)


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


def means_by_default(call: cst.Call) -> bool:
    """A loss call or constructor that averages: no `reduction` (or `"mean"`, or
    `"batchmean"`: `KLDivLoss`'s sum over the batch divided by its size, a mean of
    per-sample sums) and no legacy `size_average` / `reduce`."""
    reduction = keyword_value(call, "reduction")
    if isinstance(reduction, cst.SimpleString):
        return reduction.evaluated_value in ("mean", "batchmean")
    return reduction is None and not {"size_average", "reduce"} & {
        a.keyword.value for a in call.args if a.keyword is not None
    }


def _reduces_everything(call: cst.Call, positional: int) -> bool:
    """`t.sum()` / `torch.sum(t)` (`positional`: 0 or 1 tensor argument): no `dim`, so
    the batch is summed too."""
    given = [a for a in call.args if a.keyword is None]
    return len(given) <= positional and keyword_value(call, "dim") is None


def _reduced(call: cst.Call, torch_function: bool) -> cst.BaseExpression | None:
    """The tensor `torch.sum(t, ...)` or `t.sum(...)` reduces."""
    if not torch_function:
        return call.func.value  # type: ignore[attr-defined]
    return call.args[0].value if call.args and call.args[0].keyword is None else None


def _per_sample(call: cst.Call, torch_function: bool) -> bool:
    """`x.mean(1)`, `torch.mean(x, dim=2)`: a mean over a dimension after the batch's,
    which keeps one value per sample."""
    given = [a for a in call.args if a.keyword is None][1 if torch_function else 0 :]
    dim = keyword_value(call, "dim") or (given[0].value if given else None)
    return isinstance(dim, cst.Integer) and dim.evaluated_value > 0


def is_batch_size(node: cst.BaseExpression) -> bool:
    """A count of samples: `len(x)`, `x.size(0)`, `x.shape[0]`, `x.size()[0]`."""
    return _measured(node) is not None


def _measured(node: cst.BaseExpression) -> cst.BaseExpression | None:
    """`x` in `len(x)`, `x.size(0)`, `x.shape[0]`, `x.size()[0]`."""
    if isinstance(node, cst.Call) and is_name(node.func, "len") and len(node.args) == 1:
        return node.args[0].value
    if is_method_call(node, "size"):
        args = node.args  # type: ignore[attr-defined]
        if len(args) == 1 and isinstance(args[0].value, cst.Integer) and args[0].value.value == "0":
            return node.func.value  # type: ignore[attr-defined]
    if isinstance(node, cst.Subscript):
        tensor = _shape_of(node.value)
        index = node.slice[0].slice if len(node.slice) == 1 else None
        if (
            tensor is not None
            and isinstance(index, cst.Index)
            and isinstance(index.value, cst.Integer)
            and index.value.value == "0"
        ):
            return tensor
    return None


def _counts(divisor: cst.BaseExpression, dividend: cst.BaseExpression, place: _Place) -> bool:
    """`divisor` counts the samples `dividend` sums over: the size of a tensor the
    dividend is computed from (`bce / x.size(0)`, `bce.div(batch_size)` after
    `batch_size = len(x)`, `batch_size, channels = x.size()`), not of the dataset or a
    constant."""
    sizes: list[Value] = [divisor]
    if isinstance(divisor, cst.Name):
        sizes = assigned_values(place.scope, divisor.value)
    # (`n /= 2`, a statement, measures nothing)
    measured = [_measured(s) if isinstance(s, cst.BaseExpression) else None for s in sizes]
    if isinstance(divisor, cst.Name):
        measured += _unpacked_sizes(place.scope, divisor.value)
    return bool(measured) and all(
        tensor is not None and _reads(dividend, tensor, place.scope, frozenset())
        for tensor in measured
    )


def _unpacked_sizes(scope: cst.CSTNode, name: str) -> list[cst.BaseExpression]:
    """`x` where `scope` binds `name` first in unpacking `x.size()` or `x.shape`."""
    found = []
    for node in _own_nodes(scope):
        if not isinstance(node, cst.Assign):
            continue
        tensor = _shape_of(node.value)
        for target in (t.target for t in node.targets):
            if isinstance(target, (cst.Tuple, cst.List)) and target.elements:
                if tensor is not None and is_name(target.elements[0].value, name):
                    found.append(tensor)
    return found


def _shape_of(node: cst.BaseExpression) -> cst.BaseExpression | None:
    """`x` in `x.size()` and `x.shape`."""
    if is_method_call(node, "size") and not node.args:  # type: ignore[attr-defined]
        return node.func.value  # type: ignore[attr-defined]
    return node.value if is_attribute(node, "shape") else None  # type: ignore[attr-defined]


def _reads(
    expression: Value, tensor: cst.BaseExpression, scope: cst.CSTNode, seen: frozenset
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
            values = [*assigned_values(scope, node.value), *_unpacked_from(scope, node.value)]
            if any(_reads(value, tensor, scope, seen | {node.value}) for value in values):
                return True
    return False


def _unpacked_from(scope: cst.CSTNode, name: str) -> list[cst.BaseExpression]:
    """`v` where `scope` binds `name` by unpacking it: `out, name = model(x)` (computed
    from what `v` is computed from)."""
    found = []
    for node in _own_nodes(scope):
        if isinstance(node, cst.Assign) and not isinstance(node.value, (cst.Tuple, cst.List)):
            for target in (t.target for t in node.targets):
                if isinstance(target, (cst.Tuple, cst.List)) and any(
                    is_name(element.value, name) for element in target.elements
                ):
                    found.append(node.value)
    return found


def reaching_values(read: cst.Name, scope: cst.CSTNode, index: ModuleIndex) -> list[Value]:
    """The values `scope` assigns to the name `read` reads that may reach it: back from
    the read through the statements before it, block by enclosing block, to a plain
    assignment in one of those blocks (`loss = loss / n` after an `if` that binds `loss`
    in each branch reads the branches' values). A compound statement on the way counts
    with all its assignments, and so does a loop around the read (its next turn)."""
    found: list[Value] = []
    node: cst.CSTNode = read
    for parent in index.ancestors(read):
        if isinstance(parent, (cst.For, cst.While)) and parent is not scope:
            found += _assigned_in(parent, read.value)
        if isinstance(parent, (cst.IndentedBlock, cst.Module)):
            before = parent.body[: parent.body.index(node)]
            for statement in reversed(before):
                if isinstance(statement, (cst.FunctionDef, cst.ClassDef)):
                    continue
                found += _assigned_in(statement, read.value)
                if _binds(statement, read.value):
                    return _distinct(found)
        if parent is scope:
            return _distinct(found)
        node = parent
    return assigned_values(scope, read.value)  # not read in `scope`


def _distinct(values: list[Value]) -> list[Value]:
    """`values` without repeats of a node, in order."""
    return list({id(v): v for v in values}.values())


def _assigned_in(statement: cst.CSTNode, name: str) -> list[Value]:
    return _assignments_among(_own_nodes(statement)).get(name, [])


def _binds(statement: cst.BaseStatement, name: str) -> bool:
    """Whether `statement` surely binds `name`: `name = v` or `name /= v` on a line of its
    own (not `name += v`, whose value adds to the earlier ones)."""
    return isinstance(statement, cst.SimpleStatementLine) and any(
        value is small or isinstance(small, (cst.Assign, cst.AnnAssign))
        for small in statement.body
        for value in _assignments_among([small]).get(name, [])
    )


def assigned_values(scope: cst.CSTNode, name: str) -> list[Value]:
    """The values `scope` (a function or module, not its nested functions) assigns to
    `name`: `name = v`, `name, other = v, w`, `name += v`, `name: T = v`, and the
    statement `name /= v` itself (`v` alone is not what `name` holds)."""
    return list(_assignments(scope).get(name, ()))


@lru_cache(maxsize=256)
def _assignments(scope: cst.CSTNode) -> dict[str, list[Value]]:
    """Every name `scope` assigns, with its values, from one walk (a sum's name is looked
    up in each step of the conversion)."""
    return _assignments_among(_own_nodes(scope))


def _assignments_among(nodes: Iterable[cst.CSTNode]) -> dict[str, list[Value]]:
    found: dict[str, list[Value]] = {}
    for node in nodes:
        if isinstance(node, cst.Assign):
            for target in (t.target for t in node.targets):
                if isinstance(target, cst.Name):
                    found.setdefault(target.value, []).append(node.value)
                elif isinstance(target, cst.Tuple) and isinstance(node.value, cst.Tuple):
                    for t, v in zip(target.elements, node.value.elements):  # `total, seen = 0.0, 0`
                        if isinstance(t.value, cst.Name):
                            found.setdefault(t.value.value, []).append(v.value)
        elif isinstance(node, cst.AugAssign) and isinstance(node.target, cst.Name):
            additive = isinstance(node.operator, (cst.AddAssign, cst.SubtractAssign))
            found.setdefault(node.target.value, []).append(node.value if additive else node)
        elif isinstance(node, cst.AnnAssign):
            if isinstance(node.target, cst.Name) and node.value is not None:
                found.setdefault(node.target.value, []).append(node.value)
    return found


def _own_nodes(scope: cst.CSTNode) -> Iterable[cst.CSTNode]:
    """The nodes of `scope` (a function, module or statement), without those of functions
    and classes defined in it."""
    stack: list[cst.CSTNode] = (
        [scope.body] if isinstance(scope, cst.FunctionDef) else children(scope)[::-1]
    )
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
