"""ACC204: a device-to-host copy (and so a full GPU sync) on every training step."""

from __future__ import annotations

import libcst as cst

from autoaccel.analysis.every_step import is_interval
from autoaccel.analysis.host_values import HostValues
from autoaccel.analysis.losses import is_detached, is_functional_loss
from autoaccel.analysis.names import name_key
from autoaccel.analysis.program import FunctionInfo, Kind
from autoaccel.analysis.script_model import LoopRole, StepLoop
from autoaccel.analysis.shapes import find, is_binary, is_method_call, method_calls, tuple_items
from autoaccel.lint.rule import Invalid, LintRule

SYNC_METHODS = frozenset({"item", "cpu", "numpy", "tolist"})
# Tensor methods whose result is not a tensor on the device.
_NOT_DEVICE_TENSOR = SYNC_METHODS | frozenset(
    {
        "size",
        "dim",
        "numel",
        "nelement",
        "element_size",
        "stride",
        "data_ptr",
        "get_device",
        "is_contiguous",
        "type",
        "storage",
        "untyped_storage",
        "backward",
        "register_hook",
    }
)
# Attributes of a device tensor that are device tensors too.
_TENSOR_ATTRIBUTES = frozenset({"data", "grad", "T", "mT", "H", "real", "imag"})
_CONVERSIONS = ("builtins.float", "builtins.int", "builtins.bool")
_CUDA_SCRIPT = (
    "import torch\nfrom torch import nn\n"
    "model = nn.Linear(4, 2).cuda()\ncriterion = nn.CrossEntropyLoss()\n"
)


class HostSyncEveryStep(LintRule):
    code = "ACC204"
    name = "host-sync-every-step"
    message = (
        "Device-to-host copy on every training step waits for the GPU to finish; accumulate "
        "on the device with `.detach()` and sync every N steps"
    )

    VALID = [
        # Only every 100 steps.
        _CUDA_SCRIPT + "for step, (x, y) in enumerate(loader):\n"
        "    loss = criterion(model(x), y)\n    loss.backward()\n"
        "    if step % 100 == 0:\n        print(loss.item())\n",
        _CUDA_SCRIPT + "for x, y in loader:\n"
        "    loss = criterion(model(x), y)\n    loss.backward()\n    global_step += 1\n"
        "    if global_step == 10:\n        print(loss)\n",
        # A CPU-only script has no device to wait for.
        "import torch\nfrom torch import nn\nmodel = nn.Linear(4, 2)\ncriterion = nn.CrossEntropyLoss()\nfor x, y in loader:\n    loss = criterion(model(x), y)\n"
        "    loss.backward()\n    total += loss.item()\n",
        # Already a Python number, or a CPU batch straight from the loader.
        _CUDA_SCRIPT + "for x, y in loader:\n    loss = criterion(model(x.cuda()), y.cuda())\n"
        "    loss.backward()\n    value = 2.0\n    print(value)\n    labels = y.numpy()\n",
        # After the training loop.
        _CUDA_SCRIPT + "for x, y in loader:\n    loss = criterion(model(x), y)\n"
        "    loss.backward()\nprint(loss.item())\n",
        # An evaluation loop (no `.backward()`).
        _CUDA_SCRIPT + "from torch.utils.data import DataLoader\n"
        "loader = DataLoader(ds)\nfor x, y in loader:\n    correct += (model(x).argmax(1) == y).sum().item()\n",
    ]
    INVALID = [
        Invalid(
            _CUDA_SCRIPT + "for x, y in loader:\n    loss = criterion(model(x), y)\n"
            "    loss.backward()\n    running_loss += loss.item()\n"
        ),
        Invalid(
            _CUDA_SCRIPT + "for x, y in loader:\n    out = model(x)\n"
            "    loss = criterion(out, y)\n    loss.backward()\n    preds.append(out.argmax(1).cpu())\n"
        ),
        Invalid(
            _CUDA_SCRIPT + "for x, y in loader:\n    loss = criterion(model(x), y)\n"
            "    loss.backward()\n    print(f'loss {loss:.3f}')\n"
        ),
        # The loss a step function returns after its backward pass.
        Invalid(
            _CUDA_SCRIPT + "def train_step(x, y):\n    loss = criterion(model(x), y)\n"
            "    loss.backward()\n    return loss\n"
            "for x, y in loader:\n    loss = train_step(x, y)\n    running_loss += loss.item()\n"
        ),
        # The `else` branch of a logging gate runs on most steps.
        Invalid(
            _CUDA_SCRIPT + "for i, (x, y) in enumerate(loader):\n"
            "    loss = criterion(model(x), y)\n    loss.backward()\n"
            "    if i % 10 == 0:\n        pass\n    else:\n        history.append(float(loss))\n"
        ),
    ]

    def visit_Call(self, node: cst.Call) -> None:
        if not self.script.uses_cuda:
            return
        loop = self.enclosing_step_loop(node)
        if loop is not None:
            if loop.role is not LoopRole.TRAIN:
                return
            region: cst.CSTNode = loop.node
            gated = self._gated(node, loop)
            body = loop.node.body
        else:
            # In a function every call of which runs on a training step (`train(epoch)`
            # doing one full-batch step, `cal_performance(pred, gold)` called by the step).
            function = self._function_of(node)
            if function is None or self.script.every_step(node)[0] is not LoopRole.TRAIN:
                return
            region, gated, body = function.node, False, function.node.body
        what = self._sync(node, region)
        if what is None or gated or self.host_values.needed(node, body):
            return
        self.report(
            node,
            f"{what} on every training step waits for the GPU to finish; accumulate on "
            "the device with `.detach()` and sync every N steps",
        )

    def _function_of(self, node: cst.CSTNode) -> FunctionInfo | None:
        """The function of the program whose own body holds `node` (not a lambda's)."""
        program = self.script.program
        for ancestor in self.ancestors(node):
            if isinstance(ancestor, (cst.Lambda, cst.ClassDef)):
                return None
            if isinstance(ancestor, cst.FunctionDef):
                return program.functions.get(ancestor) if program is not None else None
        return None

    def _sync(self, call: cst.Call, region: cst.CSTNode) -> str | None:
        """What in `call` copies a device tensor to the host, described for the message."""
        func = call.func
        if isinstance(func, cst.Attribute) and func.attr.value in SYNC_METHODS:
            if not call.args and self._on_device(func.value, region):
                return f"`.{func.attr.value}()` of a CUDA tensor"
            return None
        names = self.qualified_names(func)
        conversion = next((n for n in _CONVERSIONS if n in names), None)
        if conversion is not None:
            if len(call.args) == 1 and self._on_device(call.args[0].value, region):
                return f"`{conversion.removeprefix('builtins.')}()` of a CUDA tensor"
            return None
        if "builtins.print" in names and any(
            self._formats_device_tensor(arg.value, region) for arg in call.args
        ):
            return "`print()` of a CUDA tensor"
        return None

    def _formats_device_tensor(self, value: cst.BaseExpression, region: cst.CSTNode) -> bool:
        if self._on_device(value, region):
            return True
        if isinstance(value, cst.FormattedString):
            return any(
                isinstance(part, cst.FormattedStringExpression)
                and self._on_device(part.expression, region)
                for part in value.parts
            )
        if is_binary(value, cst.Modulo):
            right = value.right  # type: ignore[attr-defined]
            return any(self._on_device(item, region) for item in tuple_items(right))
        if is_method_call(value, "format"):
            return any(self._on_device(arg.value, region) for arg in value.args)  # type: ignore[attr-defined]
        return False

    def _gated(self, node: cst.CSTNode, loop: StepLoop) -> bool:
        """Inside `if step % N == 0:` (or another test on a step counter) that logs, not
        one that updates the model every N steps."""
        counters = self._counters(loop)
        child = node
        for ancestor in self.ancestors(node):
            if ancestor is loop.node:
                return False
            if (
                isinstance(ancestor, cst.If)
                and child is ancestor.body
                and is_interval(ancestor.test, counters)
                # `if i % n_critic == 0:` around a backward pass: an update every N
                # steps, each of them paying for the sync
                and not self.script.backpropagates(ancestor.body)
            ):
                return True
            child = ancestor
        return False

    def _counters(self, loop: StepLoop) -> set[str]:
        """Names that count steps: `enumerate`'s index and names incremented in the step."""
        found: set[str] = set()
        node = loop.node
        if (
            isinstance(node, cst.For)
            and isinstance(node.iter, cst.Call)
            and self.calls(node.iter, "builtins.enumerate")
            and isinstance(node.target, cst.Tuple)
        ):
            key = name_key(node.target.elements[0].value)
            if key is not None:
                found.add(key)
        for aug in find(node.body, cst.AugAssign):
            key = name_key(aug.target) if isinstance(aug.operator, cst.AddAssign) else None
            if key is not None:
                found.add(key)
        return found

    # -- which expressions are tensors on the device ------------------------------------
    def visit_Module(self, node: cst.Module) -> None:
        self.device_names: dict[cst.CSTNode, frozenset[str]] = {}
        self.returns_device: dict[tuple[FunctionInfo, frozenset[str]], bool] = {}
        self.host_values = HostValues(self.index)

    def _on_device(self, value: cst.BaseExpression, region: cst.CSTNode) -> bool:
        """Whether `value` is a tensor on the device, in `region` (a step loop or a function
        that runs on every step)."""
        return self._holds(value, self._names_in(region))

    def _names_in(self, region: cst.CSTNode) -> frozenset[str]:
        if region not in self.device_names:
            self.device_names[region] = frozenset()  # while it is being found: none
            seeds = (
                self._device_parameters(region)
                if isinstance(region, cst.FunctionDef)
                else frozenset()
            )
            body = region.body  # type: ignore[attr-defined]
            self.device_names[region] = self._device_names(body, seeds)
        return self.device_names[region]

    def _device_parameters(self, node: cst.FunctionDef) -> frozenset[str]:
        """The parameters of the function `node` to which a call of this module on a
        training step passes a device tensor (`cal_performance(pred, gold)`)."""
        program, runs = self.script.program, self.script.step_runs
        function = program.functions.get(node) if program is not None else None
        if function is None or runs is None:
            return frozenset()
        found: set[str] = set()
        for call in runs.callers().get(function, ()):
            if program.module_of.get(call) is not self.script.module:  # type: ignore[union-attr]
                continue
            if self.script.every_step(call)[0] is not LoopRole.TRAIN:
                continue
            loop = self.enclosing_step_loop(call)
            region = loop.node if loop is not None else self._function_node(call)
            if region is None:
                continue
            names = self._names_in(region)
            found |= {p for p, arg in _bound_arguments(function, call) if self._holds(arg, names)}
        return frozenset(found)

    def _function_node(self, node: cst.CSTNode) -> cst.FunctionDef | None:
        function = self._function_of(node)
        return function.node if function is not None else None

    def _device_names(
        self, body: cst.CSTNode, seeds: frozenset[str] = frozenset()
    ) -> frozenset[str]:
        """Names that every assignment in `body` (a step's) binds to a device tensor,
        starting from `seeds` (a fixed point, so that `out = model(x)` and then
        `pred = out.argmax(1)` both count)."""
        bindings: dict[str, list[cst.BaseExpression]] = {}
        for assign in find(body, (cst.Assign, cst.AnnAssign)):
            for target, value in _pairs(assign):
                key = name_key(target)
                if key is not None:
                    bindings.setdefault(key, []).append(value)
        # A backpropagated name is a tensor with a graph: on the device in a CUDA script;
        # so are the terms of a sum that is (`(value_loss * coef + action_loss).backward()`)
        # where the step computes them.
        backpropagated = {
            key
            for call in method_calls(body, "backward")
            for key in _backpropagated_keys(call.func.value, bindings)  # type: ignore[attr-defined]
        }
        # `loss = self.compute(batch)` counts; `loss = 0.0` or `loss.item()` does not.
        names = (
            seeds
            | self._parameter_names(body)
            | frozenset(
                key
                for key in backpropagated
                if all(_computed(v) and not is_detached(v) for v in bindings.get(key, []))
            )
        )
        changed = True
        while changed:
            changed = False
            for key, values in bindings.items():
                # `correct = preds.eq(y); correct = correct.sum()`: a rebinding from itself
                if key not in names and all(self._holds(v, names | {key}) for v in values):
                    names = names | {key}
                    changed = True
        return names

    def _parameter_names(self, body: cst.CSTNode) -> frozenset[str]:
        """Loop variables over a model's parameters (`for p in model.parameters()`,
        `for name, p in self.model.named_parameters()`): tensors on the model's device."""
        found: set[str] = set()
        for loop in find(body, cst.For):
            call = loop.iter
            if not (isinstance(call, cst.Call) and isinstance(call.func, cst.Attribute)):
                continue
            method = call.func.attr.value
            if method not in ("parameters", "named_parameters") or not any(
                obj.kind is Kind.MODULE for obj in self.script.values(call.func.value)
            ):
                continue
            target = loop.target
            if (
                method == "named_parameters"
                and isinstance(target, cst.Tuple)
                and len(target.elements) == 2
            ):
                target = target.elements[1].value
            key = name_key(target)
            if key is not None:
                found.add(key)
        return frozenset(found)

    def _holds(self, value: cst.BaseExpression, names: frozenset[str]) -> bool:
        """Whether `value` is a tensor on the device, given the names known to hold one."""
        key = name_key(value)
        if key is not None:
            return key in names
        if isinstance(value, cst.Call):
            return self._call_holds(value, names)
        if isinstance(value, cst.Attribute):
            return value.attr.value in _TENSOR_ATTRIBUTES and self._holds(value.value, names)
        if isinstance(value, cst.Subscript):
            return self._holds(value.value, names)
        if isinstance(value, cst.BinaryOperation):
            return self._holds(value.left, names) or self._holds(value.right, names)
        if isinstance(value, cst.UnaryOperation):
            return self._holds(value.expression, names)
        if isinstance(value, cst.Comparison):
            return self._holds(value.left, names) or any(
                self._holds(c.comparator, names) for c in value.comparisons
            )
        return False

    def _call_holds(self, call: cst.Call, names: frozenset[str]) -> bool:
        func = call.func
        func_key = name_key(func)
        if func_key is not None and (
            func_key in self.script.models or func_key in self.script.criteria
        ):
            return True  # `model(x)`, `criterion(out, y)`
        qualified = self._qualified(func, call)
        if is_functional_loss(qualified) or self.script.returns_loss(call):
            return True  # `F.cross_entropy(...)`, `self.training_step(x, y)`
        if any(n.startswith("torch.") for n in qualified):
            # `torch.cat([...])` of device tensors, or a factory given `device=`.
            return any(
                self._holds(arg.value, names)
                or (arg.keyword is not None and arg.keyword.value == "device")
                for arg in call.args
            )
        if "builtins.map" in qualified and call.args and isinstance(call.args[0].value, cst.Lambda):
            # `map(lambda x: x.to(device), batch)`: what the lambda returns
            return self._holds(call.args[0].value.body, names)
        functions = self.script.callees(call)
        if functions and all(self._returns_device(f, call, names) for f in functions):
            return True  # `accuracy(output, labels)` computed from device tensors
        if not isinstance(func, cst.Attribute):
            return False
        method = func.attr.value
        if method == "cuda" or self.script.model_method(call):
            return True  # `agent.get_action_and_value(obs)`: a model's own method
        if method == "to":
            return self._holds(func.value, names) or any(
                self._is_device(arg.value) for arg in call.args
            )
        return method not in _NOT_DEVICE_TENSOR and self._holds(func.value, names)

    def _qualified(self, func: cst.BaseExpression, call: cst.Call) -> frozenset[str]:
        """Qualified names of `func`, read with the index of the module `call` is in (the
        body of a function of another module, `utils.accuracy`)."""
        program = self.script.program
        module = program.module_of.get(call) if program is not None else None
        index = module.index if module is not None else self.index
        return index.qualified_names(func)

    def _returns_device(
        self, function: FunctionInfo, call: cst.Call, names: frozenset[str]
    ) -> bool:
        """Whether each `return` of `function` (a function of the project that `call` runs)
        gives a device tensor, computed from the device tensors `call` passes it."""
        params = frozenset(
            p for p, arg in _bound_arguments(function, call) if self._holds(arg, names)
        )
        if not params:
            return False
        key = (function, params)
        if key not in self.returns_device:
            self.returns_device[key] = False  # while it is being found (recursion)
            inner = self._device_names(function.node.body, params)
            returns = [
                node
                for node in find(function.node.body, cst.Return)
                if next(
                    a
                    for a in function.module.index.ancestors(node)
                    if isinstance(a, (cst.FunctionDef, cst.Lambda))
                )
                is function.node
            ]
            self.returns_device[key] = bool(returns) and all(
                r.value is not None and self._holds(r.value, inner) for r in returns
            )
        return self.returns_device[key]

    def _is_device(self, value: cst.BaseExpression) -> bool:
        if isinstance(value, cst.SimpleString):
            text = value.evaluated_value
            return isinstance(text, str) and text.startswith("cuda")
        key = name_key(value)
        return key is not None and key in self.script.devices


def _pairs(
    assign: cst.Assign | cst.AnnAssign,
) -> list[tuple[cst.BaseExpression, cst.BaseExpression]]:
    """(target, value) pairs, element-wise for `x, y = x.cuda(), y.cuda()`."""
    if isinstance(assign, cst.AnnAssign):
        return [(assign.target, assign.value)] if assign.value is not None else []
    pairs = []
    for target in assign.targets:
        node = target.target
        if isinstance(node, (cst.Tuple, cst.List)):
            value = assign.value
            if isinstance(value, (cst.Tuple, cst.List)) and len(value.elements) == len(
                node.elements
            ):
                pairs.extend((t.value, v.value) for t, v in zip(node.elements, value.elements))
            else:  # `out, hidden = model(x, hidden)`
                pairs.extend((t.value, value) for t in node.elements)
        else:
            pairs.append((node, assign.value))
    return pairs


def _backpropagated_keys(
    value: cst.BaseExpression, bindings: dict[str, list[cst.BaseExpression]]
) -> list[str]:
    """The names `value.backward()` backpropagates through: `loss` of `loss.backward()`,
    and the terms of `(value_loss * coef + action_loss).backward()` that the step binds."""
    key = name_key(value)
    if key is not None:
        return [key]
    terms: list[str] = []
    stack = [value]
    while stack:
        node = stack.pop()
        if isinstance(node, cst.BinaryOperation):
            stack += [node.left, node.right]
        elif isinstance(node, cst.UnaryOperation):
            stack.append(node.expression)
        elif (key := name_key(node)) is not None and bindings.get(key):
            terms.append(key)
    return terms


def _computed(value: cst.BaseExpression) -> bool:
    """A call, a part of a value (`outputs.loss`, `model(x)[0]`), or arithmetic on one
    (`0.5 * torch.max(a, b).mean()`, `-x.mean()`): a value the step computes, not a number
    written out."""
    if isinstance(value, (cst.Call, cst.Attribute, cst.Subscript)):
        return True
    if isinstance(value, cst.BinaryOperation):
        return _computed(value.left) or _computed(value.right)
    if isinstance(value, cst.UnaryOperation):
        return _computed(value.expression)
    return False


def _bound_arguments(
    function: FunctionInfo, call: cst.Call
) -> list[tuple[str, cst.BaseExpression]]:
    """(parameter, argument) pairs of `call` to `function`; a method called on an object
    or `self` binds its first parameter to the receiver, not to an argument."""
    params = function.positional
    if function.is_method and isinstance(call.func, cst.Attribute):
        params = params[1:]
    pairs: list[tuple[str, cst.BaseExpression]] = []
    for param, arg in zip(params, [a for a in call.args if a.keyword is None]):
        if arg.star:
            break
        pairs.append((param, arg.value))
    pairs += [(a.keyword.value, a.value) for a in call.args if a.keyword is not None]
    return pairs
