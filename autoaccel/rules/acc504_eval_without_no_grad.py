"""ACC504: a loop that calls a model, trains nothing, and records autograd graphs."""

from __future__ import annotations

import libcst as cst

from autoaccel.analysis.names import name_key
from autoaccel.analysis.program import Kind
from autoaccel.analysis.script_model import LoopRole
from autoaccel.analysis.shapes import find, is_false
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
_NEEDS_GRAD_FUNCTIONS = (
    frozenset({"torch.autograd.grad", "torch.autograd.backward", "torch.enable_grad"})
    | _SET_GRAD_ENABLED
)

_SETUP = (
    "import torch\nfrom torch.utils.data import DataLoader\n"
    "model = torch.nn.Linear(4, 2)\nloader = DataLoader(ds)\n"
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
        _SETUP + "def test():\n    model.eval()\n    with torch.no_grad():\n"
        "        for x, y in loader:\n            out = model(x)\n",
        _SETUP + "@torch.no_grad()\ndef test():\n    for x, y in loader:\n        out = model(x)\n",
        _SETUP + "def test():\n    with torch.inference_mode():\n"
        "        for x, y in loader:\n            out = model(x)\n",
        # The caller turns autograd off.
        _SETUP + "def test():\n    for x, y in loader:\n        out = model(x)\n"
        "with torch.set_grad_enabled(False):\n    test()\n",
        # ... or through a function between them.
        _SETUP + "def test():\n    for x, y in loader:\n        out = model(x)\n"
        "def evaluate():\n    test()\n"
        "with torch.no_grad():\n    evaluate()\n",
        # Gradients on or off depending on a flag we cannot read.
        _SETUP + "def run(train):\n    with torch.set_grad_enabled(train):\n"
        "        for x, y in loader:\n            out = model(x)\n",
        # The forward already runs under no_grad inside the loop.
        _SETUP + "for x, y in loader:\n    x = x.float()\n    with torch.no_grad():\n"
        "        out = model(x)\n",
        # The loop calls no model.
        _SETUP + "for x, y in loader:\n    stats.update(x.mean())\n",
        # The model goes to a function of another module, which may train it.
        _SETUP + "from steps import train_step\n"
        "for x, y in loader:\n    out = model(x)\n    train_step(model, x, y)\n",
        # A helper called in the loop needs gradients.
        _SETUP + "def attack(x):\n    x.requires_grad_()\n    model(x).sum().backward()\n"
        "def test():\n    for x, y in loader:\n        attack(x)\n",
        # The outputs are backpropagated after the loop.
        _SETUP + "outs = []\nfor x, y in loader:\n    outs.append(model(x))\n"
        "torch.cat(outs).sum().backward()\n",
        # A DDP wrapper of a model the code does not show (a base class of another module
        # assigns `self.model`): no more a known model than what it wraps.
        "import torch\nfrom torch.utils.data import DataLoader\n"
        "from torch.nn.parallel import DistributedDataParallel\n"
        "from exp_basic import ExpBasic\nloader = DataLoader(ds)\nclass Exp(ExpBasic):\n"
        "    def wrap(self):\n        self.ddp_model = DistributedDataParallel(self.model)\n"
        "    def vali(self):\n        for x, y in loader:\n"
        "            out = self.ddp_model(x)\n",
    ]
    INVALID = [
        Invalid(
            _SETUP + "def test():\n    model.eval()\n"
            "    # every batch\n    for x, y in loader:\n        out = model(x)  # forward\n",
            fixed=_SETUP + "def test():\n    model.eval()\n"
            "    # every batch\n    with torch.no_grad():\n        for x, y in loader:\n"
            "            out = model(x)  # forward\n",
        ),
        # Functions calling each other, none of them with autograd off.
        Invalid(
            _SETUP + "def test(again):\n    for x, y in loader:\n        out = model(x)\n"
            "    if again:\n        rerun()\n"
            "def rerun():\n    test(False)\n",
            fixed=_SETUP + "def test(again):\n    with torch.no_grad():\n"
            "        for x, y in loader:\n            out = model(x)\n"
            "    if again:\n        rerun()\n"
            "def rerun():\n    test(False)\n",
        ),
        # Found by what the loop does, whatever the loader is called.
        Invalid(
            "from torch import nn\nfrom torch.utils.data import DataLoader\n"
            "net = nn.Linear(4, 2)\ntrain_loader = DataLoader(ds)\n"
            "for x, y in train_loader:\n    out = net(x)\n",
            fixed="import torch\nfrom torch import nn\nfrom torch.utils.data import DataLoader\n"
            "net = nn.Linear(4, 2)\ntrain_loader = DataLoader(ds)\n"
            "with torch.no_grad():\n    for x, y in train_loader:\n        out = net(x)\n",
        ),
    ]

    def __init__(self, script) -> None:
        super().__init__(script)
        self.functions: dict[str, list[cst.FunctionDef]] = {}
        self.no_grad_functions: set[str] = set()  # decorated with `@torch.no_grad()`
        self.callers: dict[str, list[cst.Call]] = {}  # function name -> its call sites
        self._grad_off: set[str] | None = None  # found after the walk, on the first question
        self._grad_off_withs: dict[cst.With, bool] = {}

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

    def _without_grad(self, node: cst.CSTNode) -> bool:
        """Whether `node` certainly or possibly runs with autograd off: inside a
        no-grad `with`, or in a function that is decorated or called that way."""
        return self._in_grad_off_context(node, self._grad_off_functions())

    def _in_grad_off_context(self, node: cst.CSTNode, off: set[str]) -> bool:
        """Whether a `with` around `node` turns autograd off, or a function around it is
        one of `off`."""
        for ancestor in self.ancestors(node):
            if isinstance(ancestor, cst.FunctionDef) and ancestor.name.value in off:
                return True
            if isinstance(ancestor, cst.With) and self._turns_grad_off(ancestor):
                return True
        return False

    def _grad_off_functions(self) -> set[str]:
        """The functions that may run with autograd off: those decorated so, and those
        called from such a place (a fixed point over the call sites, found once: a file
        of many scripts asks about the same callers for every loop)."""
        if self._grad_off is None:
            off = set(self.no_grad_functions)
            grew = True
            while grew:
                grew = False
                for name in self.functions.keys() - off:
                    if any(self._in_grad_off_context(c, off) for c in self.callers.get(name, ())):
                        off.add(name)
                        grew = True
            self._grad_off = off
        return self._grad_off

    def _turns_grad_off(self, node: cst.With) -> bool:
        known = self._grad_off_withs.get(node)
        if known is None:
            known = self._grad_off_withs[node] = any(
                self._is_no_grad(item.item) or _grad_may_be_off(self, item.item)
                for item in node.items
            )
        return known

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

    def _may_train(self, node: cst.CSTNode, seen: frozenset[str] = frozenset()) -> bool:
        """Whether `node` may train: it (or a function of this file it calls) needs
        gradients, or it hands a model or an optimizer to a function we cannot read."""
        if self._needs_grad(node):
            return True
        trainable = self.script.models | self.script.optimizers
        for call in find(node, cst.Call):
            key = name_key(call.func)
            callee = key.removeprefix("self.") if key else None
            if callee in self.functions:
                if callee not in seen and any(
                    self._may_train(f.body, seen | {callee}) for f in self.functions[callee]
                ):
                    return True
            elif (
                key not in self.script.models
                and not _is_builtin(self.qualified_names(call.func))
                and any(_root_key(arg.value) in trainable for arg in call.args)
            ):
                return True
        return False

    def _forwards(self, node: cst.CSTNode, seen: frozenset[str] = frozenset()) -> list[cst.Call]:
        """Calls of a model of the script in `node`, and in the functions of this file
        it calls: `model(x)`, `self.net(x)`, `model.forward(x)`."""
        found = []
        for call in find(node, cst.Call):
            func = call.func
            target = (
                func.value
                if isinstance(func, cst.Attribute) and func.attr.value == "forward"
                else func
            )
            if self._is_model(target):
                found.append(call)
                continue
            key = name_key(func)
            callee = key.removeprefix("self.") if key else None
            if callee in self.functions and callee not in seen:
                for function in self.functions[callee]:
                    found.extend(self._forwards(function.body, seen | {callee}))
        return found

    def _is_model(self, node: cst.BaseExpression) -> bool:
        """Whether `node` holds a model of the script: a DDP or DataParallel wrapper counts
        only when the code shows what it wraps (`DistributedDataParallel(self.model)` of a
        `self.model` only another module's base class assigns is no more known than that
        model: `convert` made such a wrapper a finding of its second pass only)."""
        if name_key(node) not in self.script.models:
            return False
        program = self.script.program
        held = [o for o in self.script.values(node) if o.kind is Kind.MODULE]
        if program is None or not held:
            return True
        return any(not o.parallel or program.read((o, "wraps")) for o in held)

    def _graph_used_elsewhere(self, loop: cst.For) -> bool:
        """A backward pass in the loop's function (or module), outside the loop and
        outside the training loops beside it, may differentiate through what the loop
        computed (`outputs.append(model(x))`, then `torch.cat(outputs).sum().backward()`)."""
        scope = self._function_of(loop)
        for call in find(scope if scope is not None else self.module, cst.Call):
            ancestors = list(self.ancestors(call))
            if loop in ancestors or self._function_of(call) is not scope:
                continue
            beside = any(
                ancestor in self.script.step_loops
                and self.script.step_loops[ancestor].role is LoopRole.TRAIN
                and loop not in self.ancestors(ancestor)
                for ancestor in ancestors
            )
            if not beside and self._needs_grad(call):
                return True
        return False

    def _function_of(self, node: cst.CSTNode) -> cst.FunctionDef | None:
        return next((a for a in self.ancestors(node) if isinstance(a, cst.FunctionDef)), None)

    # -- report ----------------------------------------------------------------------
    def visit_Module(self, node: cst.Module) -> None:
        self.module = node

    def leave_Module(self, original_node: cst.Module) -> None:
        for loop in self.script.step_loops.values():
            if loop.role is not LoopRole.EVAL or not isinstance(loop.node, cst.For):
                continue
            if loop.node.asynchronous is not None or self._without_grad(loop.node):
                continue
            forwards = self._forwards(loop.node.body)
            # A loop that calls no model records nothing worth reporting; one that
            # already runs a forward under no_grad chose what to record.
            if not forwards or any(self._without_grad(call) for call in forwards):
                continue
            if self._may_train(loop.node) or self._graph_used_elsewhere(loop.node):
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


def _root_key(value: cst.BaseExpression) -> str | None:
    """The object an argument hands over: `model`, `model.module`, `model.parameters()`
    -> `model` (a call's result, `model(x)`, is not the model)."""
    while (key := name_key(value)) is None:
        if isinstance(value, cst.Attribute):
            value = value.value
        elif isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute):
            value = value.func.value
        else:
            return None
    return key


def _is_builtin(names: frozenset[str]) -> bool:
    """`print(model)`, `len(loader)`: Python's own functions train nothing."""
    return bool(names) and all(n.startswith("builtins.") for n in names)
