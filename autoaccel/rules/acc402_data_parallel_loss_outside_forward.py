"""ACC402: the loss of an `nn.DataParallel` model computed on GPU 0, outside `forward`."""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst

from autoaccel.analysis.losses import is_loss_module
from autoaccel.analysis.names import name_key
from autoaccel.analysis.program import Kind, Obj
from autoaccel.analysis.script_model import LoopRole
from autoaccel.analysis.shapes import NO_GRAD, BindingVisitor, bound_names, find, method_calls
from autoaccel.lint.rule import Invalid, LintRule
from autoaccel.rules.acc301_missing_autocast import LayerSizes
from autoaccel.rules.acc401_data_parallel import offers_distributed

LINEAR = frozenset({"torch.nn.Linear", "torch.nn.LazyLinear"})
# Methods that keep one value per sample one per sample (`out.squeeze(1)`, `out.view(-1)`).
_SHAPE_METHODS = frozenset(
    {"view", "reshape", "squeeze", "flatten", "sigmoid", "tanh", "float", "contiguous"}
)

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
        # One value per sample is gathered: nothing to save.
        _HEADER + "model = nn.DataParallel(nn.Sequential(nn.Linear(64, 32), nn.ReLU(),"
        " nn.Linear(32, 1)))\nfor x, y in loader:\n    loss = F.mse_loss(model(x), y)\n"
        "    loss.backward()\n",
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
        wrapped = {m for m in self.script.data_parallel if not self._one_per_sample(m)}
        for loss in self.losses:
            gathered = loss.called_models & wrapped or any(
                output.scope is loss.scope and output.model in wrapped and output.names & loss.names
                for output in self.outputs
            )
            if gathered:
                self.report(loss.call)

    # -- what is gathered ------------------------------------------------------------
    def _one_per_sample(self, key: str) -> bool:
        """Whether every model the DataParallel name `key` wraps ends in a layer of one
        output (`nn.Linear(n, 1)`): what is gathered is one value per sample, no more
        than the loss."""
        program = self.script.program
        if program is None:
            return False
        models = {
            inner
            for obj in self.script.held_by(key)
            if obj.parallel == "dp"
            for inner in program.read((obj, "wraps"))
        }
        sizes = LayerSizes(program)
        return bool(models) and all(_ends_in_one_output(model, sizes) for model in models)

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


def _ends_in_one_output(model: Obj, sizes: LayerSizes) -> bool:
    """`nn.Sequential(..., nn.Linear(n, 1), nn.Sigmoid())`, or a module of the project
    whose `forward` returns `self.head(...)` for `self.head = nn.Linear(n, 1)` (through
    shape methods such as `.squeeze(1)`)."""
    if not isinstance(model.node, cst.Call):
        return False
    index = model.module.index
    if model.cls is None:
        if model.kind is not Kind.MODULE:
            return False
        layers = [a.value for a in model.node.args if isinstance(a.value, cst.Call) and not a.star]
        gemms = [c for c in layers if index.qualified_names(c.func) & sizes.layer_names]
        return bool(gemms) and sizes.outputs(gemms[-1], model.module) == 1
    forward = model.cls.method("forward")
    if forward is None:
        return False
    returns = [r for r in find(forward.node, cst.Return) if r.value is not None]
    heads = [_head(r.value) for r in returns]  # type: ignore[arg-type]
    if not heads or None in heads:
        return False
    built = {
        name_key(target.target): assign.value
        for owner in model.cls.mro()
        for method in owner.methods.values()
        for assign in find(method.node, cst.Assign)
        for target in assign.targets
    }
    for head in heads:
        layer = built.get(head)
        if not isinstance(layer, cst.Call) or not index.qualified_names(layer.func) & LINEAR:
            return False
        if sizes.outputs(layer, model.cls.module) != 1:
            return False
    return True


def _head(value: cst.BaseExpression) -> str | None:
    """`self.head` of `self.head(x)`, `self.head(x).squeeze(1)`, `self.head(x).view(-1)`."""
    while isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute):
        if value.func.attr.value not in _SHAPE_METHODS:
            break
        value = value.func.value
    if isinstance(value, cst.Call):
        key = name_key(value.func)
        return key if key is not None and key.startswith("self.") else None
    return None
