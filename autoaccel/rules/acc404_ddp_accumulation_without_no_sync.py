"""ACC404: gradient accumulation under DDP that all-reduces on every micro-step."""

from __future__ import annotations

import re

import libcst as cst

from autoaccel.analysis.names import name_key
from autoaccel.analysis.script_model import DISTRIBUTED_DATA_PARALLEL, LoopRole
from autoaccel.analysis.shapes import find, is_attribute, is_binary, method_calls
from autoaccel.lint.rule import Invalid, LintRule

# Ways to skip DDP's gradient all-reduce: the context manager, or the flag it sets.
_SYNC_CONTROLS = frozenset({"no_sync", "require_backward_grad_sync"})
_ACCUMULATION_WORD = re.compile(r"accum|update_freq|grad_steps|micro", re.I)
_LOOPS = (cst.For, cst.While)

_DDP = (
    "import torch\nfrom torch.nn.parallel import DistributedDataParallel as DDP\n"
    "model = DDP(model, device_ids=[rank])\n"
    "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
)


class DdpAccumulationWithoutNoSync(LintRule):
    code = "ACC404"
    name = "ddp-accumulation-without-no-sync"
    message = (
        "Gradient accumulation under `DistributedDataParallel` without `no_sync()`: every "
        "`backward()` all-reduces the gradients, also on the steps that do not update; run "
        "those micro-steps under `model.no_sync()` (`autoaccel convert --to ddp`)"
    )

    VALID = [
        # no_sync is used.
        _DDP + "for i, (x, y) in enumerate(loader):\n"
        "    ctx = model.no_sync() if (i + 1) % accum != 0 else nullcontext()\n"
        "    with ctx:\n        loss = model(x, y)\n        loss.backward()\n"
        "    if (i + 1) % accum == 0:\n        optimizer.step()\n        optimizer.zero_grad()\n",
        # The flag no_sync sets, written by hand.
        _DDP + "for i, (x, y) in enumerate(loader):\n"
        "    model.require_backward_grad_sync = (i + 1) % accum == 0\n"
        "    model(x, y).backward()\n"
        "    if (i + 1) % accum == 0:\n        optimizer.step()\n",
        # No accumulation: a step on every iteration.
        _DDP + "for x, y in loader:\n    model(x, y).backward()\n    optimizer.step()\n"
        "    if step % 100 == 0:\n        scheduler.step()\n",
        # A step skipped on a non-finite loss is not accumulation.
        _DDP + "for x, y in loader:\n    loss = model(x, y)\n    loss.backward()\n"
        "    if torch.isfinite(loss):\n        optimizer.step()\n",
        # Not DDP: accumulation on one process has nothing to all-reduce.
        "import torch\nmodel = Net()\noptimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "for i, (x, y) in enumerate(loader):\n    model(x, y).backward()\n"
        "    if (i + 1) % accum == 0:\n        optimizer.step()\n",
        # The backward itself is conditional.
        _DDP + "for i, (x, y) in enumerate(loader):\n    if i % 2 == 0:\n"
        "        model(x, y).backward()\n        optimizer.step()\n",
        # A user's own DistributedDataParallel.
        "import torch\nfrom mylib import DistributedDataParallel as DDP\nmodel = DDP(model)\n"
        "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "for i, (x, y) in enumerate(loader):\n    model(x, y).backward()\n"
        "    if (i + 1) % accum == 0:\n        optimizer.step()\n",
    ]
    INVALID = [
        Invalid(
            _DDP + "for i, (x, y) in enumerate(loader):\n    loss = model(x, y) / accum\n"
            "    loss.backward()\n    if (i + 1) % accum == 0:\n        optimizer.step()\n"
            "        optimizer.zero_grad()\n"
        ),
        # With a GradScaler and an accumulation flag.
        Invalid(
            _DDP + "for step, (x, y) in enumerate(loader):\n    with torch.autocast('cuda'):\n"
            "        loss = model(x, y)\n    scaler.scale(loss).backward()\n"
            "    if step + 1 == accum_steps or is_last:\n        scaler.step(optimizer)\n"
            "        scaler.update()\n"
        ),
        # The backward pass in a function the loop calls.
        Invalid(
            _DDP + "def train_step(x, y):\n    loss = model(x, y) / accum\n    loss.backward()\n"
            "for i, (x, y) in enumerate(loader):\n    train_step(x, y)\n"
            "    if (i + 1) % accum == 0:\n        optimizer.step()\n        optimizer.zero_grad()\n"
        ),
        # Micro-batches in an inner loop, one step after it.
        Invalid(
            _DDP + "for x, y in loader:\n    for mx, my in zip(x.chunk(4), y.chunk(4)):\n"
            "        model(mx, my).backward()\n    optimizer.step()\n    optimizer.zero_grad()\n"
        ),
    ]

    def __init__(self, script) -> None:
        super().__init__(script)
        self.ddp = False
        self.controls_sync = False
        self.backwards: list[cst.Call] = []

    def visit_Name(self, node: cst.Name) -> None:
        if node.value in _SYNC_CONTROLS:
            self.controls_sync = True

    def visit_Call(self, node: cst.Call) -> None:
        if self.calls(node, DISTRIBUTED_DATA_PARALLEL):
            self.ddp = True
        elif is_attribute(node.func, "backward") or self.script.runs_backward(node):
            self.backwards.append(node)  # `loss.backward()`, `self.training_step(x, y)`

    def leave_Module(self, original_node: cst.Module) -> None:
        if not (self.ddp or self.script.builds_ddp) or self.controls_sync:
            return
        for backward in self.backwards:
            loop = self.enclosing_step_loop(backward)
            if loop is None or loop.role is not LoopRole.TRAIN:
                continue
            if not self._every_iteration(backward, loop.node):
                continue
            steps = self._optimizer_steps(loop.node)
            if steps:
                accumulates = all(self._accumulation_guarded(s, loop.node) for s in steps)
            elif any(_counts_steps(arg.value) for arg in backward.args):
                # a helper that runs backward and steps when told to:
                # `loss_scaler(loss, optimizer, update_grad=(i + 1) % accum_iter == 0)`
                accumulates = True
            else:  # micro-steps in an inner loop (or a helper's loop), the update after it
                outer = next((a for a in self.ancestors(loop.node) if isinstance(a, _LOOPS)), None)
                outers = [outer] if outer is not None else self._calling_loops(loop)
                accumulates = any(self._optimizer_steps(o) for o in outers)
            if accumulates:
                self.report(backward)

    # -- helpers -------------------------------------------------------------------
    def _calling_loops(self, loop) -> list[cst.CSTNode]:
        """The loops of this module around a step loop of a helper, whose bodies call the
        helper (`for batch in loader: forward_backward(batch); optimizer.step()`)."""
        if loop.function is None:
            return []
        return [
            outer
            for outer in self.script.epoch_loops
            if any(loop.function in self.script.callees(call) for call in find(outer, cst.Call))
        ]

    def _every_iteration(self, node: cst.CSTNode, loop: cst.CSTNode) -> bool:
        """No `if`, inner loop or function between `node` and `loop`."""
        for ancestor in self.ancestors(node):
            if ancestor is loop:
                return True
            if isinstance(
                ancestor, (cst.If, cst.IfExp, cst.For, cst.While, cst.FunctionDef, cst.Lambda)
            ):
                return False
        return False

    def _accumulation_guarded(self, node: cst.CSTNode, loop: cst.CSTNode) -> bool:
        """Inside an `if` that counts micro-steps (`(i + 1) % accum == 0`)."""
        for ancestor in self.ancestors(node):
            if ancestor is loop:
                return False
            if isinstance(ancestor, cst.If) and _counts_steps(ancestor.test):
                return True
        return False

    def _optimizer_steps(self, loop: cst.CSTNode) -> list[cst.Call]:
        """`optimizer.step()` / `scaler.step(optimizer)` calls in `loop`."""
        return [
            call
            for call in method_calls(loop, "step")
            if self._is_optimizer(call.func.value)  # type: ignore[union-attr]
            or (call.args and self._is_optimizer(call.args[0].value))  # type: ignore[union-attr]
        ]

    def _is_optimizer(self, node: cst.BaseExpression) -> bool:
        key = name_key(node)
        if key is not None and key in self.script.optimizers:
            return True
        last = node.attr.value if isinstance(node, cst.Attribute) else getattr(node, "value", None)
        return isinstance(last, str) and "optim" in last.lower() and "sched" not in last.lower()


def _counts_steps(test: cst.BaseExpression) -> bool:
    if any(is_binary(node, cst.Modulo) for node in find(test, cst.BinaryOperation)):
        return True
    return any(_ACCUMULATION_WORD.search(name.value) for name in find(test, cst.Name))
