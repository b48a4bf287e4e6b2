"""ACC402: the loss of an `nn.DataParallel` model computed on GPU 0, outside `forward`."""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst

from autoaccel.analysis.losses import is_loss_module
from autoaccel.analysis.names import name_key
from autoaccel.analysis.script_model import LoopRole
from autoaccel.analysis.shapes import BindingVisitor, bound_names, find, method_calls
from autoaccel.lint.rule import Invalid, LintRule
from autoaccel.rules.acc401_data_parallel import offers_distributed

NO_GRAD = frozenset({"torch.no_grad", "torch.inference_mode"})

_HEADER = "import torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n"


@dataclass
class _Output:
    scope: cst.CSTNode | None  # innermost function, None at top level
    model: str  # name_key of the called model
    names: frozenset[str]  # names bound to (parts of) its output


@dataclass
class _Loss:
    call: cst.Call
    scope: cst.CSTNode | None
    names: frozenset[str]  # every name its arguments mention
    called_models: frozenset[str]  # models called inside its arguments


class DataParallelLossOutsideForward(BindingVisitor, LintRule):
    code = "ACC402"
    name = "data-parallel-loss-outside-forward"
    message = (
        "Loss of an `nn.DataParallel` model computed outside `forward`: every output is "
        "gathered on GPU 0 and the loss is computed there, so GPU 0 runs out of memory "
        "first; compute the loss inside `forward` (`autoaccel convert --to dp`)"
    )

    VALID = [
        # `DataParallel` is the fallback of a script that offers DDP.
        _HEADER + "from torch.nn.parallel import DistributedDataParallel as DDP\n"
        "model = DDP(net) if distributed else nn.DataParallel(net)\n"
        "for x, y in loader:\n    loss = F.cross_entropy(model(x), y)\n    loss.backward()\n",
        # The loss is computed inside forward on every replica: nothing gathered but it.
        _HEADER + "model = nn.DataParallel(ModelWithLoss(net))\n"
        "for x, y in loader:\n    loss = model(x, y).mean()\n    loss.backward()\n",
        # Not wrapped in DataParallel.
        _HEADER + "criterion = nn.CrossEntropyLoss()\nmodel = Net().cuda()\n"
        "for x, y in loader:\n    out = model(x)\n    loss = criterion(out, y)\n"
        "    loss.backward()\n",
        # `.module` bypasses DataParallel: no scatter, no gather.
        _HEADER + "model = nn.DataParallel(Net())\nfor x, y in loader:\n"
        "    out = model.module(x)\n    loss = F.cross_entropy(out, y)\n    loss.backward()\n",
        # Evaluation under no_grad keeps no activations for backward.
        _HEADER + "criterion = nn.CrossEntropyLoss()\nmodel = nn.DataParallel(Net())\n"
        "with torch.no_grad():\n    for x, y in val_loader:\n        out = model(x)\n"
        "        total += criterion(out, y).item()\n",
        # The output of the wrapped model and the loss live in different functions.
        _HEADER + "model = nn.DataParallel(Net())\n\n\ndef predict(x):\n    return model(x)\n\n\n"
        "def train_step(out, y):\n    loss = F.cross_entropy(out, y)\n    loss.backward()\n",
        # A user's own DataParallel.
        "import torch.nn.functional as F\nfrom mylib import DataParallel\n"
        "model = DataParallel(Net())\nfor x, y in loader:\n    out = model(x)\n"
        "    loss = F.cross_entropy(out, y)\n    loss.backward()\n",
        # The loss does not read the wrapped model's output.
        _HEADER + "model = nn.DataParallel(Net())\nteacher = Net()\nfor x, y in loader:\n"
        "    out = model(x)\n    t = teacher(x)\n    loss = F.mse_loss(t, y)\n    loss.backward()\n",
    ]
    INVALID = [
        Invalid(
            _HEADER + "criterion = nn.CrossEntropyLoss()\nmodel = nn.DataParallel(Net()).cuda()\n"
            "for x, y in train_loader:\n    out = model(x)\n    loss = criterion(out, y)\n"
            "    loss.backward()\n"
        ),
        Invalid(
            _HEADER + "class Trainer:\n    def __init__(self, net):\n"
            "        self.net = nn.DataParallel(net)\n\n    def step(self, x, y):\n"
            "        logits, _ = self.net(x)\n        loss = F.cross_entropy(logits.flatten(0, 1), y)\n"
            "        loss.backward()\n"
        ),
        Invalid(
            _HEADER + "model = nn.DataParallel(Net())\nfor x, y in train_loader:\n"
            "    loss = F.nll_loss(model(x), y)\n    loss.backward()\n"
        ),
    ]

    def __init__(self, script) -> None:
        super().__init__(script)
        self.outputs: list[_Output] = []
        self.losses: list[_Loss] = []

    # -- facts ---------------------------------------------------------------------
    def bind(self, target: cst.BaseExpression, value: cst.BaseExpression) -> None:
        """Record the names bound to the output of a model call (`out = model(x)`)."""
        model_call = _producing_call(value)
        if model_call is not None:
            model = name_key(model_call.func)
            names = frozenset(bound_names(target))
            if model is not None and names:
                self.outputs.append(_Output(self._scope(target), model, names))

    def visit_Call(self, node: cst.Call) -> None:
        if not self._is_loss(node) or not self._trains_here(node):
            return
        names: set[str] = set()
        models: set[str] = set()
        for arg in node.args:
            names.update(n.value for n in find(arg.value, cst.Name))
            for call in find(arg.value, cst.Call):
                key = name_key(call.func)
                if key is not None:
                    models.add(key)
        self.losses.append(_Loss(node, self._scope(node), frozenset(names), frozenset(models)))

    def leave_Module(self, original_node: cst.Module) -> None:
        if offers_distributed(self, original_node):
            return  # `DataParallel` is the fallback; DDP computes each loss on its GPU
        wrapped = self.script.data_parallel  # aliases included
        for loss in self.losses:
            gathered = loss.called_models & wrapped or any(
                output.scope is loss.scope and output.model in wrapped and output.names & loss.names
                for output in self.outputs
            )
            if gathered:
                self.report(loss.call)

    # -- helpers -------------------------------------------------------------------
    def _is_loss(self, node: cst.Call) -> bool:
        if self.script.is_loss_call(node):
            return True
        # `nn.CrossEntropyLoss()(out, y)`
        return isinstance(node.func, cst.Call) and is_loss_module(
            self.qualified_names(node.func.func)
        )

    def _trains_here(self, node: cst.CSTNode) -> bool:
        """Inside a training step, or in a function that calls `.backward()`;
        not under `torch.no_grad()` / `torch.inference_mode()`."""
        for ancestor in self.ancestors(node):
            if isinstance(ancestor, cst.With) and any(
                isinstance(item.item, cst.Call) and self.calls(item.item, *NO_GRAD)
                for item in ancestor.items
            ):
                return False
        loop = self.enclosing_step_loop(node)
        if loop is not None:
            return loop.role is LoopRole.TRAIN
        scope = self._scope(node)
        return scope is not None and bool(method_calls(scope, "backward"))

    def _scope(self, node: cst.CSTNode) -> cst.CSTNode | None:
        for ancestor in self.ancestors(node):
            if isinstance(ancestor, (cst.FunctionDef, cst.Lambda)):
                return ancestor
        return None


def _producing_call(value: cst.BaseExpression) -> cst.Call | None:
    """The call whose result `value` is made from: `model(x)`, `model(x)[0]`,
    `model(x).logits`, `model(x).squeeze(1)`."""
    while True:
        if isinstance(value, cst.Subscript):
            value = value.value
        elif isinstance(value, cst.Attribute):
            value = value.value
        elif isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute):
            if name_key(value.func) is not None:  # `self.net(x)`: the call itself
                return value
            value = value.func.value
        elif isinstance(value, cst.Call):
            return value
        else:
            return None


