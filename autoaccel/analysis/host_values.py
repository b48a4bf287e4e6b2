"""Whether the step itself needs a value copied from the device to the host.

A sync (`.item()`, `.cpu()`, `.numpy()`, `.tolist()`, `float(t)`) that only feeds logging
can wait: accumulate on the device and read every N steps. One whose value the step's own
work needs cannot, and then advice to defer it is wrong. Two shapes say so:

- the host value goes back into torch: through assignments and the results of host calls,
  it reaches an argument of a `torch` function (`actions = q.argmax(1).cpu().numpy()`, then
  `next_obs, ... = envs.step(actions)`, then `torch.Tensor(next_obs)`): the algorithm
  computes on the host (an environment, a sampler) between two device steps;
- every use decides whether the program stops (`if not math.isfinite(loss_value):
  sys.exit(1)`): the check is the point of the copy. A value that is also logged or
  accumulated every step is not only that.

Uses inside a branch that stops the program run once, at the end: they do not count. The
analysis reads names (`name_key` spellings) of one region, the loop body or function
that runs every step; it is flow-insensitive within it.
"""

from __future__ import annotations

from enum import Enum

import libcst as cst

from autoaccel.analysis.index import ModuleIndex, descendants
from autoaccel.analysis.names import name_key

# Calls that end the program.
_STOPS = frozenset({"sys.exit", "builtins.exit", "builtins.quit", "os._exit", "os.abort"})
_STATEMENTS = (cst.Assign, cst.AnnAssign, cst.AugAssign, cst.Expr, cst.Return, cst.If, cst.While)


class Use(Enum):
    DEVICE = "goes back into torch"
    STOP = "decides whether the program stops"
    OTHER = "logged, accumulated or kept"


class HostValues:
    """The questions of this module about one module (`index`); the names each region
    reads are found once."""

    def __init__(self, index: ModuleIndex) -> None:
        self.index = index
        self._reads: dict[cst.CSTNode, dict[str, list[cst.CSTNode]]] = {}

    def needed(self, sync: cst.Call, region: cst.CSTNode) -> bool:
        """Whether the step needs the host value that `sync` (a call in `region`, the
        code that runs every step) makes: it goes back into torch, or it only decides
        whether the program stops."""
        uses = self._uses(sync, region)
        return Use.DEVICE in uses or uses == {Use.STOP}

    def _uses(self, sync: cst.Call, region: cst.CSTNode) -> set[Use]:
        index = self.index
        found: set[Use] = set()
        names: list[str] = []
        _classify(sync, index, found, names)
        seen: set[str] = set()
        while names:
            key = names.pop()
            if key in seen:
                continue
            seen.add(key)
            if region not in self._reads:
                self._reads[region] = _reads(region, index)
            for read in self._reads[region].get(key, ()):
                if not _stops_around(read, region, index):
                    _classify(read, index, found, names)
        return found


def _classify(node: cst.CSTNode, index: ModuleIndex, found: set[Use], names: list[str]) -> None:
    """Add what the statement around `node` does with its value; names it binds from it
    go to `names`, to be followed."""
    child = node
    for ancestor in index.ancestors(node):
        if isinstance(ancestor, cst.Arg) and isinstance(index.parent(ancestor), cst.Call):
            call = index.parent(ancestor)
            if any(n.startswith("torch.") for n in index.qualified_names(call.func)):  # type: ignore[union-attr]
                found.add(Use.DEVICE)
                return
        if isinstance(ancestor, (cst.If, cst.While)):
            if child is ancestor.test:
                found.add(Use.STOP if _stops(ancestor.body, index) else Use.OTHER)
            else:
                found.add(Use.OTHER)
            return
        if isinstance(ancestor, (cst.Assign, cst.AnnAssign, cst.AugAssign)):
            if child is getattr(ancestor, "value", None):
                targets = (
                    [t.target for t in ancestor.targets]
                    if isinstance(ancestor, cst.Assign)
                    else [ancestor.target]
                )
                for target in targets:
                    names.extend(_bound_keys(target))
                if isinstance(ancestor, cst.AugAssign):
                    found.add(Use.OTHER)  # `total += loss.item()`: an accumulator
            return
        if isinstance(ancestor, _STATEMENTS) or isinstance(ancestor, cst.BaseCompoundStatement):
            found.add(Use.OTHER)
            return
        child = ancestor
    found.add(Use.OTHER)


def _bound_keys(target: cst.BaseExpression) -> list[str]:
    if isinstance(target, (cst.Tuple, cst.List)):
        return [key for element in target.elements for key in _bound_keys(element.value)]
    key = name_key(target)
    return [key] if key is not None else []


def _reads(region: cst.CSTNode, index: ModuleIndex) -> dict[str, list[cst.CSTNode]]:
    """The names and dotted names (`obs`, `self.step`) read in `region`, by spelling."""
    found: dict[str, list[cst.CSTNode]] = {}
    for node in descendants(region):
        if not isinstance(node, (cst.Name, cst.Attribute)):
            continue
        parent = index.parent(node)
        if isinstance(parent, cst.Attribute) and parent.value is node:
            continue  # the read is the whole dotted name (`obs.shape` reads `obs` too)
        if isinstance(parent, (cst.AssignTarget,)) or (
            isinstance(parent, (cst.AugAssign, cst.AnnAssign)) and parent.target is node
        ):
            continue
        key = name_key(node)
        while key is not None:
            found.setdefault(key, []).append(node)
            key = key.rpartition(".")[0] or None
    return found


def _stops(body: cst.CSTNode, index: ModuleIndex) -> bool:
    """Whether `body` (a block) stops the program: `raise`, or a call of `sys.exit`."""
    for statement in getattr(body, "body", ()):
        for small in (
            getattr(statement, "body", ()) if isinstance(statement, cst.SimpleStatementLine) else ()
        ):
            if isinstance(small, cst.Raise):
                return True
            if (
                isinstance(small, cst.Expr)
                and isinstance(small.value, cst.Call)
                and index.qualified_names(small.value.func) & _STOPS
            ):
                return True
    return False


def _stops_around(node: cst.CSTNode, region: cst.CSTNode, index: ModuleIndex) -> bool:
    """Whether `node` is in the body of an `if` of `region` that stops the program."""
    child = node
    for ancestor in index.ancestors(node):
        if ancestor is region:
            return False
        if isinstance(ancestor, cst.If) and child is ancestor.body and _stops(ancestor.body, index):
            return True
        child = ancestor
    return False
