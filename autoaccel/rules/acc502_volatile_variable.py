"""ACC502: `volatile=True`, PyTorch 0.3's way to skip autograd, ignored since 0.4."""

from __future__ import annotations

import libcst as cst
from libcst.metadata import ParentNodeProvider

from autoaccel.analysis.shapes import is_false
from autoaccel.cst_edit import remove_keyword, replacing
from autoaccel.lint.rule import Invalid, LintRule
from autoaccel.rules.acc501_variable_wrapper import (
    VARIABLE,
    graph_free,
    parse_variable_call,
    self_assignment,
    statement_removal,
    unwrapped,
)


class VolatileVariable(LintRule):
    code = "ACC502"
    name = "volatile-variable"
    message = (
        "`volatile=True` has had no effect since PyTorch 0.4: this code records autograd "
        "graphs; run it under `torch.no_grad()` (ACC504 finds evaluation loops)"
    )
    fix_title = "Remove the `volatile` wrapper"

    VALID = [
        "from torch.autograd import Variable\nx = Variable(data)\n",
        # `volatile=False` is the default and does nothing (ACC501 handles the wrapper).
        "from torch.autograd import Variable\nx = Variable(data, volatile=False)\n",
        # Not torch.
        "from mylib import Variable\nx = Variable(data, volatile=True)\n",
        "import torch\nx = cache.get(key, volatile=True)\n",
    ]
    INVALID = [
        Invalid(
            "import torch\nx = torch.autograd.Variable(torch.zeros(3), volatile=True)\n",
            fixed="import torch\nx = torch.zeros(3)\n",
        ),
        # `Variable` detaches what it wraps: a value that may have a graph keeps `.detach()`.
        Invalid(
            "from torch.autograd import Variable\n"
            "x, y = Variable(x.cuda(), volatile=not train), Variable(y)\n",
            fixed="from torch.autograd import Variable\nx, y = x.cuda().detach(), Variable(y)\n",
        ),
        # A DataLoader's batch has no graph; an `else:` block left empty goes, rather than
        # becoming `else: pass`.
        Invalid(
            "from torch.autograd import Variable\n"
            "from torch.utils.data import DataLoader\n"
            "for x in DataLoader(ds):\n"
            "    if use_gpu:\n"
            "        x = x.cuda()\n"
            "    else:\n"
            "        x = Variable(x, volatile=True)\n"
            "    print(model(x))\n",
            fixed="from torch.autograd import Variable\n"
            "from torch.utils.data import DataLoader\n"
            "for x in DataLoader(ds):\n"
            "    if use_gpu:\n"
            "        x = x.cuda()\n"
            "    print(model(x))\n",
        ),
        Invalid(
            "import torch\nx = torch.zeros(3, volatile=True)\n",
            fixed="import torch\nx = torch.zeros(3)\n",
        ),
        # `requires_grad=True` with `volatile=True` raises today: no fix can keep it.
        Invalid(
            "from torch.autograd import Variable\n"
            "x = Variable(data, requires_grad=True, volatile=True)\n"
        ),
    ]

    def __init__(self, script) -> None:
        super().__init__(script)
        self.handled: set[cst.Call] = set()  # reported with the statement around them

    def visit_SimpleStatementLine(self, node: cst.SimpleStatementLine) -> None:
        # `data, target = Variable(data, volatile=True), Variable(target)` becomes
        # `data, target = data, target`: the statement goes as a whole.
        found = self_assignment(self, node)
        if found is None or not found.volatile:
            return
        wrapped = [parse_variable_call(call).data for call in (*found.volatile, *found.plain)]  # type: ignore[union-attr]
        if not all(graph_free(self, data) for data in wrapped):
            return  # `x = x.detach()`, call by call: `Variable` detaches a graph
        edits = statement_removal(self, node)
        if edits is not None:
            self.handled.update(found.volatile)
            self.report(found.volatile[0], edits=edits)

    def visit_Call(self, node: cst.Call) -> None:
        if node in self.handled:
            return
        if self.calls(node, *VARIABLE):
            args = parse_variable_call(node)
            if args is None:
                if _volatile_keyword(node) is not None:
                    self.report(node)
                return
            if args.volatile is None or is_false(args.volatile):
                return
            if args.requires_grad is not None and not is_false(args.requires_grad):
                self.report(node)
                return
            parent = self.get_metadata(ParentNodeProvider, node, None)
            self.report(node, edits={node: replacing(node, parent, unwrapped(self, args.data))})
            return
        volatile = _volatile_keyword(node)
        if volatile is None or is_false(volatile):
            return
        if any(name.startswith("torch.") for name in self.qualified_names(node.func)):
            self.report(node, edits={node: remove_keyword(node, "volatile")})


def _volatile_keyword(call: cst.Call) -> cst.BaseExpression | None:
    for arg in call.args:
        if arg.keyword is not None and arg.keyword.value == "volatile":
            return arg.value
    return None
