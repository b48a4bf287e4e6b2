"""ACC503: `loss.data[0]`, PyTorch 0.3's way to read a loss, an IndexError since 0.4."""

from __future__ import annotations

import libcst as cst

from autoaccel.analysis.losses import is_functional_loss, is_loss_module
from autoaccel.analysis.names import name_key
from autoaccel.analysis.script_model import Missing, Unknown
from autoaccel.analysis.shapes import BindingVisitor, is_attribute, is_method_call
from autoaccel.cst_edit import as_receiver
from autoaccel.lint.rule import Invalid, LintRule

_SCALAR_REDUCTIONS = ("mean", "sum", "batchmean")
# `x.mean()` / `x.sum()` without arguments reduce to a 0-dim tensor.
_FULL_REDUCTIONS = ("mean", "sum")

Key = tuple[object, str]  # (defining scope, name) or ("self", attribute)


class ZeroDimIndex(BindingVisitor, LintRule):
    code = "ACC503"
    name = "zero-dim-index"
    message = (
        "`.data[0]` on a 0-dim loss raises `IndexError: invalid index of a 0-dim tensor` "
        "since PyTorch 0.4"
    )
    fix_title = "Replace `.data[0]` with `.item()`"

    VALID = [
        # Not known to be a 0-dim tensor.
        "import torch\nfirst = batch.data[0]\n",
        # An unreduced loss has one value per sample.
        "import torch.nn.functional as F\n"
        "loss = F.nll_loss(out, y, reduction='none')\nfirst = loss.data[0]\n",
        "import torch.nn as nn\ncriterion = nn.CrossEntropyLoss(reduce=False)\n"
        "loss = criterion(out, y)\nfirst = loss.data[0]\n",
        # Reassigned from something that is not a loss.
        "import torch.nn.functional as F\n"
        "loss = F.mse_loss(out, y)\nloss = losses.view(-1)\nfirst = loss.data[0]\n",
        # Already current.
        "import torch.nn.functional as F\nloss = F.mse_loss(out, y)\nvalue = loss.item()\n",
        # `loss` in another function is another variable.
        "import torch.nn.functional as F\n"
        "def train():\n    loss = F.mse_loss(out, y)\n    loss.backward()\n"
        "def show(loss):\n    print(loss.data[0])\n",
    ]
    INVALID = [
        Invalid(
            "import torch.nn.functional as F\n" "loss = F.nll_loss(out, y)\nprint(loss.data[0])\n",
            fixed="import torch.nn.functional as F\n"
            "loss = F.nll_loss(out, y)\nprint(loss.item())\n",
        ),
        Invalid(
            "import torch.nn as nn\ncriterion = nn.CrossEntropyLoss()\n"
            "total = criterion(out, y).data[0]\n",
            fixed="import torch.nn as nn\ncriterion = nn.CrossEntropyLoss()\n"
            "total = criterion(out, y).item()\n",
        ),
        Invalid(
            "import torch\nloss = (y_pred - y).pow(2).sum()\nprint(t, loss.data[0])\n",
            fixed="import torch\nloss = (y_pred - y).pow(2).sum()\nprint(t, loss.item())\n",
        ),
        # `.backward()` without a gradient only works on a 0-dim tensor.
        Invalid(
            "import torch\nerr = compute(out)\nerr.backward()\nlog(err.data[0])\n",
            fixed="import torch\nerr = compute(out)\nerr.backward()\nlog(err.item())\n",
        ),
    ]

    def __init__(self, script) -> None:
        super().__init__(script)
        self.candidates: list[cst.Subscript] = []
        self.losses: set[Key] = set()
        self.others: set[Key] = set()  # assigned something that is not known to be 0-dim
        self.backward: set[Key] = set()  # `key.backward()` without a gradient: certainly 0-dim
        self.unreduced_criteria: set[str] = set()  # criteria built with `reduction="none"`
        self.criterion_reductions: dict[str, bool] = {}  # criterion key -> reduces to 0-dim

    # -- facts ---------------------------------------------------------------------
    def visit_Subscript(self, node: cst.Subscript) -> None:
        if not _is_data_zero(node):
            return
        parent = self.parent(node)
        if isinstance(parent, (cst.AssignTarget, cst.AugAssign)) and parent.target is node:
            return  # `x.data[0] = ...` writes into a tensor
        self.candidates.append(node)

    def visit_AugAssign(self, node: cst.AugAssign) -> None:
        # `total_loss += criterion(out, y)`: a number plus a 0-dim tensor is 0-dim.
        key = self._key(node.target)
        if key is not None and self._is_loss(node.value):
            self.losses.add(key)

    def visit_Call(self, node: cst.Call) -> None:
        # `loss.backward()` without a gradient argument needs a 0-dim tensor.
        if is_method_call(node, "backward") and not node.args:
            key = self._key(node.func.value)  # type: ignore[attr-defined]
            if key is not None:
                self.backward.add(key)

    def bind(self, target: cst.BaseExpression, value: cst.BaseExpression) -> None:
        key = self._key(target)
        if key is None:
            return
        if isinstance(value, cst.Call):
            reduces = self._loss_module_reduces(value)
            if reduces is not None:
                criterion = name_key(target)
                if criterion is not None:
                    self.criterion_reductions[criterion] = reduces
                    if not reduces:
                        self.unreduced_criteria.add(criterion)
        if self._is_loss(value):
            self.losses.add(key)
        elif not isinstance(value, (cst.Integer, cst.Float)):
            self.others.add(key)

    # -- what is a 0-dim loss --------------------------------------------------------
    def _key(self, node: cst.BaseExpression) -> Key | None:
        if isinstance(node, cst.Name):
            scope = self.index.scopes.get(node)
            while scope is not None and node.value not in scope.bindings:
                if scope.parent is None:
                    break
                scope = scope.parent
            return (scope, node.value) if scope is not None else None
        key = name_key(node)
        return ("self", key) if key is not None else None

    def _is_loss(self, node: cst.BaseExpression) -> bool:
        if isinstance(node, cst.BinaryOperation):
            sides = (node.left, node.right)
            return any(self._is_loss(side) for side in sides) and all(
                self._is_loss(side) or isinstance(side, (cst.Integer, cst.Float)) for side in sides
            )
        if isinstance(node, (cst.Name, cst.Attribute)):
            key = self._key(node)
            return key is not None and (
                key in self.backward or (key in self.losses and key not in self.others)
            )
        if not isinstance(node, cst.Call):
            return False
        func = node.func
        if (
            isinstance(func, cst.Attribute)
            and func.attr.value in _FULL_REDUCTIONS
            and not node.args
        ):
            return True
        names = self.qualified_names(func)
        if is_functional_loss(names):
            return self._reduces(node)
        if isinstance(func, cst.Call):  # `nn.MSELoss()(out, y)`
            return self._loss_module_reduces(func) is True
        criterion = name_key(func)
        if criterion is None or criterion not in self.script.criteria:
            return False
        if criterion in self.criterion_reductions:
            return self.criterion_reductions[criterion]
        # Reached through an alias or an argument: trust it when no criterion in the
        # file keeps per-sample values.
        return not self.unreduced_criteria

    def _loss_module_reduces(self, call: cst.Call) -> bool | None:
        """For `nn.XLoss(...)`: whether its output is 0-dim; None for other calls."""
        if not is_loss_module(self.qualified_names(call.func)):
            return None
        return self._reduces(call)

    def _reduces(self, call: cst.Call) -> bool:
        reduction = self.script.keyword(call, "reduction")
        reduce = self.script.keyword(call, "reduce")
        if isinstance(reduction, Unknown) or isinstance(reduce, Unknown):
            return False
        if not isinstance(reduction, Missing) and not (
            isinstance(reduction, cst.SimpleString)
            and reduction.evaluated_value in _SCALAR_REDUCTIONS
        ):
            return False
        return isinstance(reduce, Missing) or (
            isinstance(reduce, cst.Name) and reduce.value == "True"
        )

    # -- report ----------------------------------------------------------------------
    def leave_Module(self, original_node: cst.Module) -> None:
        for node in self.candidates:
            tensor = node.value.value  # type: ignore[attr-defined]
            if not self._is_loss(tensor):
                continue
            item = cst.Call(func=cst.Attribute(value=as_receiver(tensor), attr=cst.Name("item")))
            self.report(node, edits={node: item.with_changes(lpar=node.lpar, rpar=node.rpar)})


def _is_data_zero(node: cst.Subscript) -> bool:
    """`x.data[0]`."""
    if not is_attribute(node.value, "data") or len(node.slice) != 1:
        return False
    index = node.slice[0].slice
    return (
        isinstance(index, cst.Index)
        and isinstance(index.value, cst.Integer)
        and index.value.value == "0"
    )
