"""ACC203: a loss tensor summed or collected across training steps with its graph."""

from __future__ import annotations

from functools import cached_property

import libcst as cst

from autoaccel.analysis.index import descendants
from autoaccel.analysis.losses import is_detached
from autoaccel.analysis.names import name_key
from autoaccel.analysis.script_model import LoopRole, StepLoop
from autoaccel.analysis.shapes import (
    find,
    is_attribute,
    is_binary,
    is_method_call,
    is_name,
    method_calls,
)
from autoaccel.lint.rule import Applicability, Invalid, LintRule

NO_GRAD = ("torch.no_grad", "torch.inference_mode", "torch.autograd.grad_mode.no_grad")
# Calls whose result is a Python number, the same with or without the sum's graph.
_TO_NUMBER = frozenset({"builtins.float", "builtins.int", "builtins.bool", "builtins.len"})
# Builtins that return the tensor they are given (or another one with its graph).
_PASS_ON = frozenset(
    {"builtins.sum", "builtins.min", "builtins.max", "builtins.abs", "builtins.round"}
)
_LIST_METHODS = frozenset({"append", "extend", "clear"})


class LossAccumulatedWithGraph(LintRule):
    code = "ACC203"
    name = "loss-accumulated-with-graph"
    message = (
        "Loss tensor accumulated across training steps keeps every step's autograd graph "
        "alive; accumulate `loss.detach()` (or `loss.item()` for a Python number)"
    )
    fix_title = "Accumulate `.detach()` of the loss"
    # Safe when every read of the sum turns it into a number (`.item()`, `float()`, a
    # formatted f-string...): `.detach()` keeps its value, type and device and only
    # frees the graph. Otherwise the sum may reach a backward or an output the rule
    # cannot see (returned, passed on, printed as a tensor, kept in `self`).
    unsafe_for = (
        "sums read other than as a number (returned, passed on, printed, `self.` attributes)"
    )

    VALID = [
        # Already a number or detached.
        "import torch\nfor x, y in loader:\n    loss = criterion(model(x), y)\n"
        "    loss.backward()\n    total += loss.item()\n",
        "import torch\nfor x, y in loader:\n    loss = criterion(model(x), y)\n"
        "    loss.backward()\n    total += loss.detach()\n",
        # The sum is what gets backpropagated: keeping the graph is the point.
        "import torch\nfor x, y in loader:\n    total = 0\n    for head in heads:\n"
        "        loss = criterion(head(x), y)\n        total = total + loss\n    total.backward()\n",
        # Not a training step loop (nothing calls `.backward()`).
        "import torch\nfor x, y in loader:\n    loss = criterion(model(x), y)\n    total += loss\n",
        # Summed over micro-batches, then backpropagated: the graph is needed.
        "import torch\nfor i, (x, y) in enumerate(loader):\n    loss = criterion(model(x), y)\n"
        "    total = total + loss\n    if i % 4 == 3:\n        (total / 4).backward()\n        total = 0\n",
        # Evaluation under `no_grad` builds no graph.
        "import torch\nfor x, y in loader:\n    loss = criterion(model(x), y)\n    loss.backward()\n"
        "    with torch.no_grad():\n        val = criterion(model(v), w)\n        total += val\n",
        # A list made afresh every step does not outlive the step.
        "import torch\nfor x, y in loader:\n    losses = []\n    loss = criterion(model(x), y)\n"
        "    loss.backward()\n    losses.append(loss)\n",
        # `loss` is a number here.
        "import torch\nfor x, y in loader:\n    out = model(x)\n    out.sum().backward()\n"
        "    loss = out.mean().item()\n    total += loss\n",
    ]
    INVALID = [
        Invalid(
            "import torch\ntotal = 0.0\nfor x, y in loader:\n    loss = criterion(model(x), y)\n"
            "    loss.backward()\n    total += loss\nprint(total / len(loader))\n",
            fixed="import torch\ntotal = 0.0\nfor x, y in loader:\n    loss = criterion(model(x), y)\n"
            "    loss.backward()\n    total += loss.detach()\nprint(total / len(loader))\n",
        ),
        Invalid(
            "import torch\nlosses = []\nfor x, y in loader:\n    loss = criterion(model(x), y)\n"
            "    loss.backward()\n    losses.append(loss)\nprint(torch.stack(losses).mean())\n",
            fixed="import torch\nlosses = []\nfor x, y in loader:\n    loss = criterion(model(x), y)\n"
            "    loss.backward()\n    losses.append(loss.detach())\nprint(torch.stack(losses).mean())\n",
        ),
        Invalid(
            "import torch.nn.functional as F\nfor x, y in loader:\n    loss = F.cross_entropy(model(x), y)\n"
            "    (loss / 2).backward()\n    running = running + loss * x.size(0)\n",
            fixed="import torch.nn.functional as F\nfor x, y in loader:\n    loss = F.cross_entropy(model(x), y)\n"
            "    (loss / 2).backward()\n    running = running + loss.detach() * x.size(0)\n",
        ),
    ]

    def visit_Module(self, node: cst.Module) -> None:
        self.module = node

    @cached_property
    def backpropagated(self) -> set[str]:
        """Accumulators that are backpropagated: they keep their graph on purpose."""
        script = self.script
        module_of = script.program.module_of  # type: ignore[union-attr]
        return {
            key
            for call in script.training.backward_calls
            if module_of.get(call) is script.module
            for key in _backpropagated_keys(call)
        }

    # -- the three accumulation shapes -------------------------------------------------
    def visit_AugAssign(self, node: cst.AugAssign) -> None:
        if isinstance(node.operator, cst.AddAssign):
            self._check(node, name_key(node.target), node.value)

    def visit_Assign(self, node: cst.Assign) -> None:
        value = node.value
        if len(node.targets) != 1 or not is_binary(value, cst.Add):
            return
        key = name_key(node.targets[0].target)
        if key is not None and name_key(value.left) == key:  # type: ignore[attr-defined]
            self._check(node, key, value.right)  # type: ignore[attr-defined]
        elif key is not None and name_key(value.right) == key:  # type: ignore[attr-defined]
            self._check(node, key, value.left)  # type: ignore[attr-defined]

    def visit_Call(self, node: cst.Call) -> None:
        if (
            is_attribute(node.func, "append")
            and len(node.args) == 1
            and node.args[0].keyword is None
            and not node.args[0].star
        ):
            self._check(node, name_key(node.func.value), node.args[0].value)  # type: ignore[attr-defined]

    # -- analysis -------------------------------------------------------------------------
    def _check(self, node: cst.CSTNode, key: str | None, value: cst.BaseExpression) -> None:
        if key is None:
            return
        loop = self.enclosing_step_loop(node)
        if (
            loop is None
            or loop.role is not LoopRole.TRAIN
            or key in self.backpropagated
            or self._under_no_grad(node, loop)
        ):
            return
        loss = self._graph_loss(value, loop)
        if loss is None or _bound_earlier_in_step(loop, node, key):
            return
        replacement = cst.Call(func=cst.Attribute(value=loss, attr=cst.Name("detach")))
        safe = self._read_only_as_numbers(node, key)
        self.report(
            node, edits={loss: replacement}, applicability=None if safe else Applicability.UNSAFE
        )

    def _graph_loss(self, value: cst.BaseExpression, loop: StepLoop) -> cst.BaseExpression | None:
        """The part of `value` that is a loss tensor with its graph: `loss`,
        `criterion(out, y)`, or either of them scaled (`loss * x.size(0)`)."""
        if isinstance(value, cst.BinaryOperation) and isinstance(
            value.operator, (cst.Multiply, cst.Divide)
        ):
            return self._graph_loss(value.left, loop) or self._graph_loss(value.right, loop)
        if isinstance(value, cst.Call):
            return value if self.script.is_loss_call(value) else None
        key = name_key(value)
        if key is not None and self._is_loss_name(key, loop):
            return value
        return None

    def _is_loss_name(self, key: str, loop: StepLoop) -> bool:
        """`key` holds a loss with a graph in this step: it is backpropagated or comes
        from a loss function, and no assignment in the step turns it into a number."""
        body = loop.node.body
        values = [
            node.value  # type: ignore[attr-defined]
            for node in find(body, (cst.Assign, cst.AnnAssign))
            if any(name_key(t) == key for t in _targets(node))  # type: ignore[arg-type]
        ]
        if any(is_detached(v) for v in values if v is not None):
            return False
        backpropagated = any(key in _backward_keys(call) for call in method_calls(body, "backward"))
        from_loss = any(
            isinstance(v, cst.Call)
            and self.script.is_loss_call(v)
            or any(self.script.is_loss_call(c) for c in find(v, cst.Call))
            for v in values
            if v is not None
        )
        return backpropagated or from_loss

    def _under_no_grad(self, node: cst.CSTNode, loop: StepLoop) -> bool:
        for ancestor in self.ancestors(node):
            if ancestor is loop.node:
                return False
            if isinstance(ancestor, cst.With) and any(
                isinstance(item.item, cst.Call) and self.calls(item.item, *NO_GRAD)
                for item in ancestor.items
            ):
                return True
        return False

    def _read_only_as_numbers(self, statement: cst.CSTNode, key: str) -> bool:
        """Whether every read of the accumulator `key` in its function (or module) makes
        a Python number of it, so that nothing can tell whether it had a graph."""
        if "." in key:
            return False  # `self.total`: other methods and modules may read it
        scope: cst.CSTNode = next(
            (a for a in self.ancestors(statement) if isinstance(a, cst.FunctionDef)), self.module
        )
        if any(is_name(item.name, key) for item in find(scope, cst.NameItem)):
            return False  # `global total` / `nonlocal total`: read elsewhere too
        return all(
            self._is_write(name, key) or self._ends_as_number(name)
            for name in find(scope, cst.Name)
            if name.value == key
        )

    def _is_write(self, node: cst.CSTNode, key: str) -> bool:
        parent = self.parent(node)
        if isinstance(parent, cst.AssignTarget) or (
            isinstance(parent, (cst.AugAssign, cst.AnnAssign)) and parent.target is node
        ):
            return True
        if isinstance(parent, cst.Attribute) and parent.value is node:
            # `losses.append(...)`: the accumulation itself.
            return parent.attr.value in _LIST_METHODS
        # The `total` in `total = total + loss`.
        grandparent = self.parent(parent) if parent is not None else None
        return (
            isinstance(parent, cst.BinaryOperation)
            and isinstance(parent.operator, cst.Add)
            and isinstance(grandparent, cst.Assign)
            and any(name_key(t.target) == key for t in grandparent.targets)
        )

    def _ends_as_number(self, node: cst.CSTNode) -> bool:
        """Whether the value read at `node`, through arithmetic, indexing, tensor
        methods and `sum()`/`min()`/`max()`, ends as a number: `.item()`, `.tolist()`,
        `.detach()`, `float()`, `len()`, `math.*`, a comparison, or an f-string field
        with a format spec (which formats `.item()` for a 0-dim tensor)."""
        while True:
            parent = self.parent(node)
            if isinstance(parent, (cst.BinaryOperation, cst.UnaryOperation)) or (
                isinstance(parent, cst.Subscript) and parent.value is node
            ):
                node = parent
            elif isinstance(parent, cst.Attribute) and parent.value is node:
                call = self.parent(parent)
                if parent.attr.value == "data":
                    return True
                if not (isinstance(call, cst.Call) and call.func is parent):
                    return False  # `total.grad_fn`, `total.requires_grad`
                if parent.attr.value in ("item", "tolist", "detach"):
                    return True
                node = call  # `total.cpu()`, `total.mean()`: still a tensor
            elif isinstance(parent, cst.Arg) and parent.keyword is None and not parent.star:
                call = self.parent(parent)
                names = self.qualified_names(call.func)  # type: ignore[union-attr]
                if names & _TO_NUMBER or any(n.startswith("math.") for n in names):
                    return True
                if not names & _PASS_ON:
                    return False  # `print(total)` shows its `grad_fn`; `f(total)` may backward
                node = call  # type: ignore[assignment]
            elif isinstance(parent, cst.FormattedStringExpression):
                return (
                    parent.expression is node
                    and parent.format_spec is not None
                    and parent.conversion is None
                )
            else:
                return isinstance(parent, (cst.Comparison, cst.ComparisonTarget))


def _targets(node: cst.Assign | cst.AnnAssign) -> list[cst.BaseExpression]:
    if isinstance(node, cst.AnnAssign):
        return [node.target]
    found: list[cst.BaseExpression] = []
    for target in node.targets:
        value = target.target
        if isinstance(value, (cst.Tuple, cst.List)):
            found.extend(element.value for element in value.elements)
        else:
            found.append(value)
    return found


def _backward_keys(call: cst.Call) -> list[str]:
    """What a `.backward()` call may backpropagate: `loss.backward()`,
    `scaler.scale(loss).backward()`, `accelerator.backward(loss)` (its first argument
    counts too: for a tensor's own `.backward(gradient)` that only silences more)."""
    receiver = call.func.value  # type: ignore[attr-defined]
    if is_method_call(receiver, "scale") and receiver.args:
        receiver = receiver.args[0].value
    arguments = [arg.value for arg in call.args[:1] if arg.keyword is None and not arg.star]
    return [key for key in map(name_key, [receiver, *arguments]) if key is not None]


def _backpropagated_keys(call: cst.Call) -> set[str]:
    """Every name a `.backward()` call's receiver or arguments read: the accumulator
    of `(total / accumulation_steps).backward()` keeps its graph on purpose."""
    return {
        key
        for part in [call.func.value, *(arg.value for arg in call.args)]  # type: ignore[attr-defined]
        for node in find(part, (cst.Name, cst.Attribute))
        if (key := name_key(node)) is not None
    }


def _bound_earlier_in_step(loop: StepLoop, accumulation: cst.CSTNode, key: str) -> bool:
    """Whether the step may give `key` a fresh value (one that does not read `key`)
    before `accumulation`: then `key = key + x` sums within one step (`loss = loss +
    w * prior_loss`), and the value does not carry over from the previous step."""
    for node in descendants(loop.node.body):  # in source order
        if node is accumulation:
            return False
        if (
            isinstance(node, (cst.Assign, cst.AnnAssign))
            and node.value is not None
            and any(name_key(t) == key for t in _targets(node))
            and not any(name_key(n) == key for n in find(node.value, (cst.Name, cst.Attribute)))
        ):
            return True
    return False
