"""ACC206: a tensor built on the CPU by a factory, then copied to the device every step."""

from __future__ import annotations

from collections.abc import Iterator

import libcst as cst
from libcst.metadata import PositionProvider

from autoaccel.analysis.names import name_key
from autoaccel.analysis.program import FunctionInfo
from autoaccel.analysis.script_model import Missing
from autoaccel.analysis.shapes import find, is_attribute
from autoaccel.cst_edit import set_keyword
from autoaccel.lint.rule import Applicability, Invalid, LintRule

# Factories that take `device=` and fill the tensor the same way on every device.
DETERMINISTIC = frozenset(
    {
        "zeros",
        "ones",
        "empty",
        "full",
        "arange",
        "linspace",
        "logspace",
        "eye",
    }
)
# Factories that draw from a generator: CPU and CUDA generators give different numbers.
RANDOM = frozenset({"rand", "randn", "randint", "randperm"})
FACTORIES = {f"torch.{name}": name for name in DETERMINISTIC | RANDOM}
# Functions that join CPU tensors into a CPU tensor.
_JOINS = frozenset({"torch.cat", "torch.stack", "torch.concat", "torch.concatenate"})
# Methods whose result may be on another device than their receiver.
_MOVES = frozenset({"to", "cuda", "cpu", "type", "pin_memory", "xpu", "mps"})
_STEP = "import torch\ndevice = torch.device('cuda')\nfor x, y in loader:\n    {}\n    model(x).sum().backward()\n"


class CpuTensorMovedToDevice(LintRule):
    code = "ACC206"
    name = "cpu-tensor-moved-to-device"
    message = "Tensor is built on the CPU and then copied to the device on every step"
    fix_title = "Create the tensor on the device with `device=`"
    unsafe_for = "random factories (CUDA draws other numbers)"

    VALID = [
        _STEP.format("x = torch.zeros(8, device='cuda')"),
        _STEP.format("x = torch.zeros(8, device=device).to(device)"),
        # `.to(...)` with something that may be a dtype or a tensor is not a move we can see.
        _STEP.format("x = torch.zeros(8).to(torch.float16)"),
        _STEP.format("x = torch.zeros(8).to(other)"),
        _STEP.format("x = torch.zeros(8).to('cpu')"),
        _STEP.format("x = torch.zeros(8).to(torch.device('cpu'))"),
        # A device passed through `**kwargs` cannot be seen.
        _STEP.format("x = torch.zeros(8, **options).cuda()"),
        # Not a factory that takes `device=`.
        _STEP.format("x = torch.from_numpy(a).cuda()"),
        # `*_like` builds on the device of its argument, which may already be the target.
        _STEP.format("u = torch.zeros_like(x).to(x.device)"),
        # Data from the host is copied from the host either way (`device=` copies too).
        _STEP.format("x = torch.tensor([0.5, 0.5]).cuda()"),
        # A user's own function of the same name.
        "def zeros(n):\n    return [0] * n\n" + _STEP.format("x = zeros(8).cuda()"),
        "from mylib import zeros\n" + _STEP.format("x = zeros(8).cuda()"),
        # Built once, before training: one copy in the whole run.
        "import torch\nx = torch.zeros(8).cuda()\n",
        _STEP.replace("for x", "buf = torch.zeros(64, 8).to(device)\nfor x").format("pass"),
        # A name rebound on the way (to a tensor that may live anywhere) is not followed.
        _STEP.format("m = torch.arange(8)\n    m = other(m)\n    m = m.to(device)"),
    ]
    INVALID = [
        Invalid(
            _STEP.format("x = torch.zeros(8).cuda()"),
            fixed=_STEP.format('x = torch.zeros(8, device="cuda")'),
        ),
        Invalid(
            _STEP.format("x = torch.ones(2, 3).to(device)"),
            fixed=_STEP.format("x = torch.ones(2, 3, device=device)"),
        ),
        Invalid(
            "from torch import arange\n" + _STEP.format("y = arange(8).to(device='cuda:0')"),
            fixed="from torch import arange\n" + _STEP.format("y = arange(8, device='cuda:0')"),
        ),
        Invalid(
            _STEP.format("noise = torch.randn(4, 100).to(x.device)"),
            fixed=_STEP.format("noise = torch.randn(4, 100, device=x.device)"),
        ),
        # A dtype or `non_blocking` on the move: reported, not rewritten.
        Invalid(_STEP.format("x = torch.zeros(8).to('cuda', torch.float16)")),
        Invalid(_STEP.format("x = torch.zeros(8).cuda(non_blocking=True)")),
        # In a function the training step calls.
        Invalid(
            "import torch\ndef targets(n):\n    return torch.zeros(n).cuda()\n"
            "for x, y in loader:\n    model(x).sum().backward()\n    t = targets(8)\n"
        ),
        # Built from factories on the CPU over a few lines, then moved.
        Invalid(
            _STEP.format(
                "m = torch.cat([torch.arange(4) for _ in range(2)])\n"
                "    m = (m.unsqueeze(0) == m.unsqueeze(1)).float()\n    m = m.to(device)"
            )
        ),
    ]

    def visit_Module(self, node: cst.Module) -> None:
        self._per_step_functions: set[cst.FunctionDef] | None = None

    def visit_Call(self, node: cst.Call) -> None:
        if not is_attribute(node.func, "cuda", "to"):
            return
        receiver = node.func.value  # type: ignore[attr-defined]
        if isinstance(receiver, cst.Call) and self._factory(receiver) is not None:
            self._check_chained(node, receiver)
        elif isinstance(receiver, (cst.Name, cst.Call)):
            # `t.to(device)`, `alpha.expand_as(x).to(x.device)` of a name built earlier
            self._check_origin(node, receiver)

    def _check_chained(self, node: cst.Call, factory: cst.Call) -> None:
        """`torch.zeros(n).to(device)`: reported, and fixed when the move is plain."""
        name = self._factory(factory)
        if name is None:
            return
        target = self._target(node)
        if target is None or not self._per_step(node):
            return
        edits = {}
        if isinstance(target, cst.BaseExpression):
            fixed = set_keyword(factory, "device", target)
            edits[node] = fixed.with_changes(lpar=node.lpar, rpar=node.rpar)
        self.report(
            node,
            f"`torch.{name}(...)` builds the tensor on the CPU and then copies it to the "
            "device, on every step",
            edits=edits,
            # The CUDA generator draws other numbers than the CPU one: see the doc.
            applicability=Applicability.UNSAFE if name in RANDOM else None,
        )

    def _check_origin(self, node: cst.Call, tensor: cst.BaseExpression) -> None:
        """`t = torch.arange(n)` ... `t = t.to(device)` (or `t.expand_as(x).to(device)`):
        reported at the factory, unfixed."""
        if self._target(node) is None or not self._per_step(node):
            return
        factory = self._cpu_origin(tensor, self._statement(node))
        if factory is None:
            return
        line = self.get_metadata(PositionProvider, node).start.line
        self.report(
            factory,
            f"`torch.{self._factory(factory)}(...)` builds a tensor on the CPU that line {line}"
            " copies to the device, on every step",
        )

    # -- evidence: the line runs on every step --------------------------------------------
    def _per_step(self, node: cst.CSTNode) -> bool:
        """Whether `node` runs on every training or evaluation step: inside a step loop (or
        a loop within one), or in a function that a step loop calls, directly or not."""
        for ancestor in self.ancestors(node):
            if ancestor in self.script.step_loops or ancestor in self.script.micro_loops:
                return True
            if isinstance(ancestor, cst.FunctionDef):
                return ancestor in self._functions_steps_run()
            if isinstance(ancestor, (cst.Lambda, cst.ClassDef)):
                return False
        return False

    def _functions_steps_run(self) -> set[cst.FunctionDef]:
        if self._per_step_functions is None:
            reached: Iterator[FunctionInfo] = (
                function
                for loop in self.script.training.step_loops.values()
                for function in loop.reached
            )
            self._per_step_functions = {function.node for function in reached}
        return self._per_step_functions

    # -- a tensor built from factories on the CPU ------------------------------------------
    def _factory(self, call: cst.Call) -> str | None:
        """`zeros` for a `torch.zeros(...)` call that builds on the CPU (no `device=`/`out=`)."""
        names = sorted(FACTORIES[n] for n in self.qualified_names(call.func) if n in FACTORIES)
        if not names:
            return None
        if not isinstance(self.script.keyword(call, "device"), Missing):
            return None
        if not isinstance(self.script.keyword(call, "out"), Missing):
            return None
        return names[0]

    def _cpu_origin(self, value: cst.BaseExpression, before: cst.CSTNode | None) -> cst.Call | None:
        """The factory call a CPU tensor `value` is built from, when every part of it is
        built on the CPU (factories, `torch.cat`, comparisons, arithmetic, methods that
        keep the device); names are followed to their last plain assignment in the same
        block before the statement `before`."""
        if isinstance(value, cst.Name):
            assigned = self._last_assignment(value.value, before)
            return None if assigned is None else self._cpu_origin(*assigned)
        if isinstance(value, cst.Call):
            if self._factory(value) is not None:
                return value
            func = value.func
            if self.calls(value, *_JOINS) and value.args:
                parts = value.args[0].value
                if isinstance(parts, (cst.List, cst.Tuple)):
                    origins = [self._cpu_origin(e.value, before) for e in parts.elements]
                    return origins[0] if origins and all(origins) else None
                if isinstance(parts, (cst.ListComp, cst.GeneratorExp)):
                    return self._cpu_origin(parts.elt, before)  # type: ignore[arg-type]
                return None
            if isinstance(func, cst.Attribute) and func.attr.value not in _MOVES:
                return self._cpu_origin(func.value, before)
            return None
        if isinstance(value, cst.Comparison):
            operands = [value.left, *(c.comparator for c in value.comparisons)]
            return self._first_origin(operands, before)
        if isinstance(value, cst.BinaryOperation):
            return self._first_origin([value.left, value.right], before)
        if isinstance(value, cst.UnaryOperation):
            return self._cpu_origin(value.expression, before)
        if isinstance(value, cst.Subscript):
            return self._cpu_origin(value.value, before)
        return None

    def _first_origin(
        self, operands: list[cst.BaseExpression], before: cst.CSTNode | None
    ) -> cst.Call | None:
        """The origin of the tensor operands, when each operand is a CPU tensor or a number."""
        origins = [
            None if isinstance(o, (cst.Integer, cst.Float)) else self._cpu_origin(o, before)
            for o in operands
        ]
        numbers = [isinstance(o, (cst.Integer, cst.Float)) for o in operands]
        if any(o is None and not n for o, n in zip(origins, numbers)):
            return None
        return next((o for o in origins if o is not None), None)

    def _statement(self, node: cst.CSTNode) -> cst.SimpleStatementLine | None:
        return next(
            (a for a in self.ancestors(node) if isinstance(a, cst.SimpleStatementLine)), None
        )

    def _last_assignment(
        self, name: str, statement: cst.CSTNode | None
    ) -> tuple[cst.BaseExpression, cst.SimpleStatementLine] | None:
        """The value of the last `name = ...` in the block of `statement`, before it; None
        when a statement between (a branch, a loop) may rebind it."""
        block = self.parent(statement) if statement is not None else None
        body = getattr(block, "body", None)
        if statement is None or not isinstance(body, (list, tuple)):
            return None
        for earlier in reversed(body[: body.index(statement)]):
            binds = any(
                isinstance(n, cst.Name) and n.value == name
                for target in find(earlier, (cst.AssignTarget, cst.AugAssign, cst.AnnAssign))
                for n in find(target.target, cst.Name)
            )
            if not binds:
                continue
            assign = earlier.body[0] if isinstance(earlier, cst.SimpleStatementLine) else None
            if (
                isinstance(assign, cst.Assign)
                and len(earlier.body) == 1  # type: ignore[union-attr]
                and len(assign.targets) == 1
                and isinstance(assign.targets[0].target, cst.Name)
            ):
                return assign.value, earlier  # type: ignore[return-value]
            return None
        return None

    # -- the move ----------------------------------------------------------------------------
    def _target(self, move: cst.Call) -> cst.BaseExpression | bool | None:
        """The device `move` copies to: an expression when the move is plain (fixable),
        True when it is a device move with other arguments, None when it is not one."""
        method = move.func.attr.value  # type: ignore[attr-defined]
        args = move.args
        if any(arg.star for arg in args):
            return None
        if method == "cuda":
            return cst.SimpleString('"cuda"') if not args else True
        device = next((a.value for a in args if a.keyword and a.keyword.value == "device"), None)
        if device is None and args and args[0].keyword is None:
            device = args[0].value
        if device is None or not self._is_device(device):
            return None
        return device if len(args) == 1 else True

    def _is_device(self, value: cst.BaseExpression) -> bool:
        """Whether `value` certainly names an accelerator device (not a dtype, not a tensor)."""
        if isinstance(value, cst.SimpleString):
            text = value.evaluated_value
            return isinstance(text, str) and text.split(":")[0] in (
                "cuda",
                "mps",
                "xpu",
            )
        if is_attribute(value, "device"):
            return True  # `other.device`
        if isinstance(value, cst.Call):
            first = value.args[0].value if value.args else None
            on_cpu = isinstance(first, cst.SimpleString) and first.evaluated_value == "cpu"
            return "torch.device" in self.qualified_names(value.func) and not on_cpu
        key = name_key(value)
        return key is not None and key in self.script.devices
