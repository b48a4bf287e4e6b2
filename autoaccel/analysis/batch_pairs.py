"""Where a computation meets the samples of a batch with each other: a contrastive
loss's similarity matrix (`z @ z.t()`), pairwise distances, triplets picked from the batch.
Split across GPUs (`nn.DataParallel`) or processes (DDP), such a loss pairs only the
samples of each part: it is another loss. Also the names a statement reads and binds,
which the tracing of what derives from the batch follows."""

from __future__ import annotations

from collections.abc import Iterable
from typing import cast

import libcst as cst
import libcst.matchers as m

from autoaccel.analysis.index import ModuleIndex
from autoaccel.analysis.names import name_key
from autoaccel.analysis.program import FunctionInfo, Obj
from autoaccel.analysis.shapes import find, is_method_call
from autoaccel.cst_edit import code_of


def assigned(statement: cst.CSTNode) -> set[str]:
    """Names (and `self.x` keys) a statement binds."""
    found: set[str] = set()
    for target in find(
        statement, (cst.AssignTarget, cst.AugAssign, cst.AnnAssign, cst.WithItem, cst.For)
    ):
        expr: cst.CSTNode | None = None
        if isinstance(target, cst.WithItem):
            expr = target.asname.name if target.asname else None
        elif isinstance(target, (cst.AssignTarget, cst.AugAssign, cst.AnnAssign, cst.For)):
            expr = target.target
        if expr is None:
            continue
        for node in find(expr, (cst.Name, cst.Attribute)):
            key = name_key(node)
            if key:
                found.add(key)
    return found


def read(statement: cst.CSTNode) -> set[str]:
    """Variable names a statement reads (attribute names, keywords and the annotations of
    local variables, which Python does not evaluate, left out)."""
    names = {id(n): n.value for n in find(statement, cst.Name)}
    for annotation in find(statement, cst.Annotation):
        for name in find(annotation, cst.Name):
            names.pop(id(name), None)
    for node in find(statement, (cst.Attribute, cst.Arg)):
        inner = node.attr if isinstance(node, cst.Attribute) else cast(cst.Arg, node).keyword
        if inner is not None:
            names.pop(id(inner), None)
    for target in find(statement, (cst.AssignTarget, cst.AnnAssign)):
        bound = cast(cst.AssignTarget | cst.AnnAssign, target).target
        if isinstance(bound, cst.Name):
            names.pop(id(bound), None)
        elif isinstance(bound, (cst.Tuple, cst.List)):
            for element in bound.elements:
                if isinstance(element.value, cst.Name):
                    names.pop(id(element.value), None)
    return set(names.values())


# Distances between every two rows (of one tensor, or of the first two arguments).
_PAIRWISE = frozenset({"torch.cdist", "torch.pdist", "torch.nn.functional.pdist"})
# A function or method of the project (`select(x)`, `self.selector.get_triplets(x)`).
_PROJECT_CALLEE = m.Name() | m.Attribute(value=m.Name("self") | m.Attribute(value=m.Name("self")))


def how_it_pairs(function: FunctionInfo) -> str | None:
    """How `function` pairs samples of its tensor arguments, where it does (see
    `pairing_in`)."""
    params = {p.name.value for p in function.node.params.params} - {"self"}
    found = pairing_in(function.node.body, params, function.module.index)
    return found[0] if found is not None else None


def called_pairing(call: cst.Call, callees: Iterable[Obj]) -> tuple[str, str] | None:
    """Where `call` runs a function, or the `forward` of a module class, of the project
    (`callees`: what its callee may be) that pairs samples of its arguments: its name
    (`nt_xent`, `TripletLoss.forward`) and how it pairs them."""
    for obj in callees:
        cls = obj.cls if obj.cls is not None and obj.cls.is_module else None
        function = cls.method("forward") if cls is not None else obj.function
        pairing = how_it_pairs(function) if function is not None else None
        if pairing is not None:
            return (f"{cls.name}.forward" if cls else function.node.name.value), pairing  # type: ignore[union-attr]
    return None


def pairing_in(
    body: cst.CSTNode, batch: set[str], index: ModuleIndex
) -> tuple[str, cst.SimpleStatementLine] | None:
    """How the statements of `body` pair samples of the `batch` tensors, and the first
    statement that does: a product of what derives from them with itself turned on its side
    (a similarity matrix), pairwise distances (`torch.cdist(x, x)`), or indexing one with
    indices a function of the project computed from them (an online triplet loss)."""
    picked: set[str] = set()  # indices computed from the batch by the project's code
    derived = set(batch)  # the batch, and what the statements compute from it
    for s in find(body, cst.SimpleStatementLine):
        if read(s) & derived:
            derived |= assigned(s)
        similarity = _similarities(s, derived, index)
        if similarity is not None:
            return f"compares every sample with every other: `{code_of(similarity)}`", s
        for call in find(s, cst.Call):
            qualified = index.qualified_names(call.func)
            if not read(call) & batch:
                continue
            # `torch.cdist(x, x)`, not `torch.cdist(x, self.centres)`: a per-sample distance
            if qualified & _PAIRWISE and all(read(a) & batch for a in call.args[:2]):
                return f"takes pairwise distances with `{code_of(call.func)}`", s
            if not qualified and m.matches(call.func, _PROJECT_CALLEE):
                picked |= assigned(s)
        for sub in find(s, cst.Subscript):
            taken = {n.value for element in sub.slice for n in find(element, cst.Name)}
            indexed = sub.value
            if isinstance(indexed, cst.Name) and indexed.value in batch and taken & picked:
                how = f"indexes `{indexed.value}` with `{min(taken & picked)}`, computed from the batch"
                return how, s
    return None


def _similarities(
    statement: cst.CSTNode, derived: set[str], index: ModuleIndex
) -> cst.CSTNode | None:
    """A product of the batch with itself in `statement` (a contrastive loss's similarity
    matrix): `z @ z.t()`, `torch.mm(a, b.T)`, or a broadcast of two of its tensors against
    each other (`cos(z1.unsqueeze(-2), z2.unsqueeze(-3))`), each operand computed from
    the `derived` names."""
    for node in find(statement, (cst.BinaryOperation, cst.Call)):
        operands: list[cst.BaseExpression] = []
        if isinstance(node, cst.BinaryOperation):
            if isinstance(node.operator, cst.MatrixMultiply):
                operands = [node.left, node.right]
        elif isinstance(node, cst.Call):
            func = node.func
            if index.qualified_names(func) & _MATRIX_PRODUCTS:
                operands = [a.value for a in node.args[:2]]
            elif is_method_call(node, "mm", "matmul") and node.args:
                operands = [func.value, node.args[0].value]  # type: ignore[attr-defined]
            elif _broadcast_against_itself(node, derived):
                return node
        if len(operands) == 2 and read(operands[0]) & derived and _transposed(operands[1], derived):
            return node
    return None


_MATRIX_PRODUCTS = frozenset({"torch.mm", "torch.matmul"})


def _transposed(node: cst.BaseExpression, derived: set[str]) -> bool:
    """Whether `node` is a matrix of the batch turned on its side (`z.t()`, `z.T`,
    `z.transpose(0, 1)`): a product with it meets every sample with every other. (A
    batched `k.transpose(-2, -1)` of attention pairs positions within each sample.)"""
    inner: cst.BaseExpression | None = None
    if isinstance(node, cst.Attribute) and node.attr.value == "T":
        inner = node.value
    elif isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute):
        method = node.func.attr.value
        dims = {code_of(a.value) for a in node.args}
        if (method == "t" and not dims) or (method == "transpose" and dims == {"0", "1"}):
            inner = node.func.value
    return inner is not None and bool(read(inner) & derived)


def _broadcast_against_itself(call: cst.Call, derived: set[str]) -> bool:
    """`f(z1.unsqueeze(-2), z2.unsqueeze(-3))`: two tensors of the batch given new axes in
    different places, so that every sample meets every other."""
    axes = set()
    for arg in call.args:
        value = arg.value
        if (
            isinstance(value, cst.Call)
            and isinstance(value.func, cst.Attribute)
            and value.func.attr.value == "unsqueeze"
            and value.args
            and read(value.func.value) & derived
        ):
            axes.add(code_of(value.args[0].value))
    return len(axes) > 1
