"""Training loops that read a loader by phase (the PyTorch fine-tuning tutorial's shape).

    loaders = {"train": train_loader, "val": val_loader}
    for epoch in range(epochs):
        for phase in ["train", "val"]:
            for x, y in loaders[phase]:
                ...
                if phase == "train":
                    loss.backward()
                    optimizer.step()

One loop body serves every phase; only the phases whose `if phase == "...":` holds the
`backward()` train. The others evaluate: their loader is not a training loader, and what
their branches do (`if phase == "val": ... args.batch_size`) is not the training step's.
"""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst

from autoaccel.analysis.index import ModuleIndex
from autoaccel.analysis.loss_reduction import assigned_values
from autoaccel.analysis.shapes import find, is_method_call, is_name
from autoaccel.analysis.training import StepLoop


@dataclass(frozen=True)
class Phases:
    """A step loop over `loaders[phase]`, inside `for phase in [...]`."""

    name: str  # the phase variable: `phase`
    holder: str  # the dict's name: `loaders`
    phase_loop: cst.For
    loaders: dict[str, cst.BaseExpression]  # phase -> the loader expression in the dict
    keys: dict[str, cst.SimpleString]  # phase -> its key as written
    training: frozenset[str]  # the phases whose branch runs the backward pass

    @property
    def evaluating(self) -> frozenset[str]:
        return frozenset(self.loaders) - self.training

    def in_evaluation(self, node: cst.CSTNode, index: ModuleIndex) -> bool:
        """Whether `node` runs only in phases that do not train: under `if phase == "val":`,
        or in the `else:` of `if phase == "train":`."""
        child: cst.CSTNode = node
        for ancestor in index.ancestors(node):
            if isinstance(ancestor, cst.If):
                tested = phase_test(ancestor.test, self.name)
                if tested is not None:
                    inside = child is ancestor.body
                    if inside and tested <= self.evaluating:
                        return True
                    if not inside and child is ancestor.orelse and tested >= self.training:
                        return True
            if ancestor is self.phase_loop:
                return False
            child = ancestor
        return False


def phases_of(step: StepLoop, index: ModuleIndex) -> Phases | None:
    """The phases of `step`, a `for` loop over `loaders[phase]` (through `enumerate()` or
    a progress bar), when `loaders` is a dict of string keys bound once in the scope,
    `phase` runs over a list of those strings, and every `backward()` of the loop runs
    under a test of the phase. None otherwise."""
    loop = step.node
    if not isinstance(loop, cst.For):
        return None
    iterable = loop.iter
    while isinstance(iterable, cst.Call) and iterable.args and not iterable.args[0].keyword:
        iterable = iterable.args[0].value
    if not (
        isinstance(iterable, cst.Subscript)
        and isinstance(iterable.value, cst.Name)
        and len(iterable.slice) == 1
        and isinstance(iterable.slice[0].slice, cst.Index)
        and isinstance(iterable.slice[0].slice.value, cst.Name)
    ):
        return None
    holder, name = iterable.value.value, iterable.slice[0].slice.value.value
    phase_loop = next(
        (a for a in index.ancestors(loop) if isinstance(a, cst.For) and is_name(a.target, name)),
        None,
    )
    if phase_loop is None or not _strings(phase_loop.iter):
        return None
    bound = assigned_values(index.scope_of(loop), holder)
    if len(bound) != 1 or not isinstance(bound[0], cst.Dict):
        return None
    loaders: dict[str, cst.BaseExpression] = {}
    keys: dict[str, cst.SimpleString] = {}
    for element in bound[0].elements:
        key = element.key if isinstance(element, cst.DictElement) else None
        if not isinstance(key, cst.SimpleString) or not isinstance(key.evaluated_value, str):
            return None
        loaders[key.evaluated_value] = element.value
        keys[key.evaluated_value] = key
    if not set(_strings(phase_loop.iter)) <= set(loaders):
        return None
    training: set[str] = set()
    for backward in (c for c in find(loop.body, cst.Call) if is_method_call(c, "backward")):
        tests = [
            tested
            for a in index.ancestors(backward)
            if isinstance(a, cst.If) and (tested := phase_test(a.test, name)) is not None
        ]
        if not tests:
            return None  # a backward pass in every phase
        training |= tests[0]
    if not training or training >= set(loaders):
        return None
    return Phases(name, holder, phase_loop, loaders, keys, frozenset(training))


def phase_test(test: cst.BaseExpression, name: str) -> frozenset[str] | None:
    """The phases `test` holds for: `phase == "train"`, `"train" == phase`."""
    if not isinstance(test, cst.Comparison) or len(test.comparisons) != 1:
        return None
    target = test.comparisons[0]
    if not isinstance(target.operator, cst.Equal):
        return None
    for left, right in ((test.left, target.comparator), (target.comparator, test.left)):
        if (
            is_name(left, name)
            and isinstance(right, cst.SimpleString)
            and isinstance(right.evaluated_value, str)
        ):
            return frozenset({right.evaluated_value})
    return None


def _strings(node: cst.BaseExpression) -> list[str]:
    """The strings of a list or tuple display of string literals; empty otherwise."""
    if not isinstance(node, (cst.List, cst.Tuple)):
        return []
    values = [
        e.value.evaluated_value
        for e in node.elements
        if isinstance(e.value, cst.SimpleString) and isinstance(e.value.evaluated_value, str)
    ]
    return values if len(values) == len(node.elements) else []
