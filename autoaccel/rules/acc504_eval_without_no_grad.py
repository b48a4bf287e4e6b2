"""ACC504: an evaluation loop that records autograd graphs it never uses."""

from __future__ import annotations

import re

import libcst as cst

from autoaccel.analysis.names import name_key
from autoaccel.analysis.script_model import LoopRole, StepLoop
from autoaccel.analysis.shapes import find, is_false, method_calls
from autoaccel.lint.rule import Invalid, LintRule

_NO_GRAD = frozenset(
    {
        "torch.no_grad",
        "torch.autograd.no_grad",
        "torch.autograd.grad_mode.no_grad",
        "torch.inference_mode",
        "torch.autograd.inference_mode",
        "torch.autograd.grad_mode.inference_mode",
    }
)
_SET_GRAD_ENABLED = frozenset(
    {
        "torch.set_grad_enabled",
        "torch.autograd.set_grad_enabled",
        "torch.autograd.grad_mode.set_grad_enabled",
    }
)
# Calls inside a loop that need gradients: wrapping it would break them.
_NEEDS_GRAD_METHODS = ("backward", "step", "zero_grad", "requires_grad_", "retain_grad")
_NEEDS_GRAD_FUNCTIONS = frozenset(
    {"torch.autograd.grad", "torch.autograd.backward", "torch.enable_grad"}
) | _SET_GRAD_ENABLED
_EVAL_NAME = re.compile(
    r"(^|_)(eval|evaluate|evaluation|test|testing|valid|validate|validation|val|predict|"
    r"prediction|infer|inference)(_|$)",
    re.IGNORECASE,
)


class EvalWithoutNoGrad(LintRule):
    code = "ACC504"
    name = "eval-without-no-grad"
    message = (
        "Evaluation loop runs with autograd enabled: every forward records a graph "
        "and keeps its activations"
    )
    fix_title = "Wrap the loop in `with torch.no_grad():`"

    VALID = [
        "import torch\nfrom torch.utils.data import DataLoader\n"
        "test_loader = DataLoader(ds)\n"
        "def test():\n    model.eval()\n    with torch.no_grad():\n"
        "        for x, y in test_loader:\n            out = model(x)\n",
        "import torch\nfrom torch.utils.data import DataLoader\n"
        "test_loader = DataLoader(ds)\n"
        "@torch.no_grad()\ndef test():\n    model.eval()\n"
        "    for x, y in test_loader:\n        out = model(x)\n",
        "from torch import inference_mode\nfrom torch.utils.data import DataLoader\n"
        "test_loader = DataLoader(ds)\n"
        "def test():\n    model.eval()\n    with inference_mode():\n"
        "        for x, y in test_loader:\n            out = model(x)\n",
        # The caller turns autograd off.
        "import torch\nfrom torch.utils.data import DataLoader\n"
        "test_loader = DataLoader(ds)\n"
        "def test():\n    model.eval()\n    for x, y in test_loader:\n        out = model(x)\n"
        "with torch.set_grad_enabled(False):\n    test()\n",
        # Gradients on or off depending on a flag we cannot read.
        "import torch\nfrom torch.utils.data import DataLoader\n"
        "test_loader = DataLoader(ds)\n"
        "def run(train):\n    model.eval()\n    with torch.set_grad_enabled(train):\n"
        "        for x, y in test_loader:\n            out = model(x)\n",
        # Nothing says this loop evaluates (it may train through a helper).
        "import torch\nfrom torch.utils.data import DataLoader\n"
        "loader = DataLoader(ds)\n"
        "def run():\n    for x, y in loader:\n        out = step(model, x, y)\n",
        # A helper called in the loop needs gradients.
        "import torch\nfrom torch.utils.data import DataLoader\n"
        "test_loader = DataLoader(ds)\n"
        "def attack(x):\n    x.requires_grad_()\n    model(x).sum().backward()\n"
        "def test():\n    model.eval()\n    for x, y in test_loader:\n        attack(x)\n",
    ]
    INVALID = [
        Invalid(
            "import torch\nfrom torch.utils.data import DataLoader\n"
            "test_loader = DataLoader(ds)\n"
            "def test():\n    model.eval()\n"
            "    # every batch\n    for x, y in test_loader:\n        out = model(x)  # forward\n",
            fixed="import torch\nfrom torch.utils.data import DataLoader\n"
            "test_loader = DataLoader(ds)\n"
            "def test():\n    model.eval()\n"
            "    # every batch\n    with torch.no_grad():\n        for x, y in test_loader:\n"
            "            out = model(x)  # forward\n",
        ),
        Invalid(
            "from torch import nn\nfrom torch.utils.data import DataLoader\n"
            "val_loader = DataLoader(ds)\n"
            "for x, y in val_loader:\n    out = model(x)\n",
            fixed="from torch import nn\nfrom torch.utils.data import DataLoader\nimport torch\n"
            "val_loader = DataLoader(ds)\n"
            "with torch.no_grad():\n    for x, y in val_loader:\n        out = model(x)\n",
        ),
    ]

    def __init__(self, script) -> None:
        super().__init__(script)
        self.functions: dict[str, list[cst.FunctionDef]] = {}
        self.no_grad_functions: set[str] = set()  # decorated with `@torch.no_grad()`
        self.callers: dict[str, list[cst.Call]] = {}  # function name -> its call sites
        self.function_of: dict[cst.CSTNode, cst.FunctionDef | None] = {}

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self.functions.setdefault(node.name.value, []).append(node)
        if any(self._is_no_grad(decorator.decorator) for decorator in node.decorators):
            self.no_grad_functions.add(node.name.value)

    def visit_Call(self, node: cst.Call) -> None:
        key = name_key(node.func)
        if key is not None:
            self.callers.setdefault(key.removeprefix("self."), []).append(node)

    # -- context ---------------------------------------------------------------------
    def _is_no_grad(self, expression: cst.BaseExpression) -> bool:
        """`torch.no_grad()`, `torch.no_grad`, `torch.set_grad_enabled(False)`..."""
        call = expression if isinstance(expression, cst.Call) else None
        func = call.func if call is not None else expression
        names = self.qualified_names(func)
        if names & _NO_GRAD:
            # `inference_mode(False)` turns it off again.
            return call is None or not call.args or not is_false(call.args[0].value)
        if names & _SET_GRAD_ENABLED and call is not None and call.args:
            return is_false(call.args[0].value)
        return False

    def _without_grad(self, node: cst.CSTNode, seen: frozenset[str] = frozenset()) -> bool:
        """Whether `node` certainly or possibly runs with autograd off: inside a
        no-grad `with`, or in a function that is decorated or called that way."""
        for ancestor in self.ancestors(node):
            if isinstance(ancestor, (cst.With, cst.FunctionDef)) and self._turns_grad_off(
                ancestor, seen
            ):
                return True
        return False

    def _turns_grad_off(self, node: cst.With | cst.FunctionDef, seen: frozenset[str]) -> bool:
        if isinstance(node, cst.With):
            return any(
                self._is_no_grad(item.item) or _grad_may_be_off(self, item.item)
                for item in node.items
            )
        name = node.name.value
        if name in self.no_grad_functions:
            return True
        if name in seen:
            return False
        return any(
            self._without_grad(call, seen | {name}) for call in self.callers.get(name, [])
        )

    def _needs_grad(self, node: cst.CSTNode, seen: frozenset[str] = frozenset()) -> bool:
        """Whether `node` (or a function of this file it calls) needs gradients."""
        for call in find(node, cst.Call):
            func = call.func
            if isinstance(func, cst.Attribute) and func.attr.value in _NEEDS_GRAD_METHODS:
                return True
            if self.qualified_names(func) & _NEEDS_GRAD_FUNCTIONS:
                return True
            key = name_key(func)
            callee = key.removeprefix("self.") if key else None
            if callee in self.functions and callee not in seen:
                if any(self._needs_grad(f, seen | {callee}) for f in self.functions[callee]):
                    return True
        return False

    def _evaluates(self, loop: StepLoop) -> bool:
        """Positive evidence that the loop evaluates: an eval/test name, or `model.eval()`."""
        if loop.loader is not None and re.search(
            r"test|val|eval", loop.loader, re.IGNORECASE
        ):
            return True
        function = next(
            (a for a in self.ancestors(loop.node) if isinstance(a, cst.FunctionDef)), None
        )
        if function is not None and _EVAL_NAME.search(function.name.value):
            return True
        scope = function if function is not None else loop.node
        return any(not call.args for call in method_calls(scope, "eval"))

    # -- report ----------------------------------------------------------------------
    def leave_Module(self, original_node: cst.Module) -> None:
        for loop in self.script.step_loops.values():
            if loop.role is not LoopRole.EVAL or not isinstance(loop.node, cst.For):
                continue
            if loop.node.asynchronous is not None:
                continue
            if self._without_grad(loop.node) or self._needs_grad(loop.node):
                continue
            if not self._evaluates(loop):
                continue
            self.report(loop.node, edits={loop.node: _wrapped(loop.node)}, imports=("torch",))


def _wrapped(loop: cst.For) -> cst.With:
    """`with torch.no_grad():` around `loop`; comments above the loop stay above."""
    return cst.With(
        items=[cst.WithItem(item=cst.parse_expression("torch.no_grad()"))],
        body=cst.IndentedBlock(body=[loop.with_changes(leading_lines=[])]),
        leading_lines=loop.leading_lines,
    )


def _grad_may_be_off(rule: LintRule, expression: cst.BaseExpression) -> bool:
    """`torch.set_grad_enabled(flag)` with a flag we cannot read."""
    if not isinstance(expression, cst.Call) or not expression.args:
        return False
    if not rule.qualified_names(expression.func) & _SET_GRAD_ENABLED:
        return False
    flag = expression.args[0].value
    return not (isinstance(flag, cst.Name) and flag.value in ("True", "False"))
