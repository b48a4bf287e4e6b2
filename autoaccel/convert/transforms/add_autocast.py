"""Mixed precision: run the forward pass and loss under `torch.autocast`.

`--amp bf16` (default) wraps, in every training step loop, the statements from the
first model call (else the first call of a method of a model's class, `flow.log_probs(x)`)
up to the last assignment of each tensor whose `.backward()` is called in
`with torch.autocast(device_type=..., dtype=torch.bfloat16, enabled=...):`;
evaluation loops get their model calls wrapped. The wrap goes where the forward pass and
loss run: in the body of a micro-batch loop inside the step (`for mx, my in
zip(x.chunk(4), y.chunk(4)):`), or in the step function the loop calls (`train_step()`),
also when that function is in another module of the project: that module's conversion
wraps it. Autocast (and the scaler) is enabled
only on CUDA: CPU autocast is slower and less precise for these models, so the converted
script computes exactly what the original did when it runs on a CPU. `--amp fp16` also routes backward and
`optimizer.step()` through one `torch.amp.GradScaler` (unscaling before gradient
clipping). Backward, `step()` and `zero_grad()` stay outside the autocast block.

`binary_cross_entropy` (`nn.BCELoss`) is rejected by CUDA autocast as "unsafe to
autocast" (torch.amp docs, "CUDA Ops that can autocast to float32"), so such a loss
is computed after the block. A bfloat16/float16 output of a block that reaches a model
or a loss outside every block (the discriminator of a GAN called inside its BCE loss, an
evaluation loss after the forward pass) is cast back there with `.float()`: a float32
layer rejects a low-precision input, and a loss of it would be computed in low precision.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import libcst as cst
import libcst.matchers as m

from autoaccel.analysis.names import name_key
from autoaccel.analysis.script_model import LoopRole, StepLoop
from autoaccel.analysis.shapes import called_function, find, is_method_call, method_calls
from autoaccel.convert.log import ConvertOptions
from autoaccel.convert.transform import Transform
from autoaccel.convert.transforms.data_parallel.wraps import wrapper_instances
from autoaccel.cst_edit import add_imports, code_of

_FALLBACK_DEVICE = '"cuda" if torch.cuda.is_available() else "cpu"'
_BCE = frozenset({"torch.nn.BCELoss", "torch.nn.functional.binary_cross_entropy"})
_CLIP = frozenset(
    {
        "torch.nn.utils.clip_grad_norm_",
        "torch.nn.utils.clip_grad_value_",
        "torch.nn.utils.clip_grad_norm",
        "torch.nn.utils.clip_grad.clip_grad_norm_",
        "torch.nn.utils.clip_grad.clip_grad_value_",
    }
)
Statements = list[cst.BaseStatement]


@dataclass
class _BlockPlan:
    """What to do to the statements of one block (loop body, function body, module)."""

    # (first, last) original indices of statements to put under one autocast block
    wraps: list[tuple[int, int]] = field(default_factory=list)
    device: str = _FALLBACK_DEVICE


def _on_cuda(device: str) -> str:
    """The `enabled=` expression of autocast for the device type expression `device`."""
    return "torch.cuda.is_available()" if device == _FALLBACK_DEVICE else f'{device} == "cuda"'


@dataclass
class _Edits:
    blocks: dict[cst.CSTNode, _BlockPlan] = field(default_factory=dict)  # keyed by body node
    before: dict[cst.CSTNode, list[str]] = field(default_factory=dict)  # statement -> code
    after: dict[cst.CSTNode, list[str]] = field(default_factory=dict)
    replace: dict[cst.CSTNode, str] = field(default_factory=dict)  # small statement -> kind
    float_args: set[cst.Arg] = field(default_factory=set)  # autocast outputs: `.float()`
    # `.numpy()` of an autocast output (NumPy has no bfloat16): `.float().numpy()`
    float_numpy: set[cst.Call] = field(default_factory=set)
    scaler: dict[cst.CSTNode, str] = field(default_factory=dict)  # statement -> scaler name


def _is_autocast_with(node: cst.CSTNode) -> bool:
    return isinstance(node, cst.With) and any(
        isinstance(item.item, cst.Call) and code_of(item.item.func).endswith("autocast")
        for item in node.items
    )


def _backward_target(statement: cst.CSTNode) -> cst.BaseExpression | None:
    """`X` of a statement `X.backward(...)`."""
    if (
        isinstance(statement, cst.SimpleStatementLine)
        and len(statement.body) == 1
        and m.matches(
            statement.body[0],
            m.Expr(value=m.Call(func=m.Attribute(attr=m.Name("backward")))),
        )
    ):
        return statement.body[0].value.func.value  # type: ignore[attr-defined]
    return None


def _assigned_value(statement: cst.CSTNode) -> cst.BaseExpression | None:
    """The value of a one-assignment statement line (`x = v`, `x += v`, `x: T = v`)."""
    if isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1:
        small = statement.body[0]
        if isinstance(small, (cst.Assign, cst.AugAssign, cst.AnnAssign)):
            return small.value
    return None


def _mentioned(node: cst.CSTNode | None) -> set[str]:
    """The name keys (`x`, `self.out`) that `node` reads."""
    if node is None:
        return set()
    keys = {name_key(n) for n in find(node, (cst.Name, cst.Attribute))}
    return {key for key in keys if key}


def _assigned_keys(statement: cst.CSTNode) -> set[str]:
    keys: set[str] = set()
    if not isinstance(statement, cst.SimpleStatementLine):
        return keys
    for small in statement.body:
        targets: list[cst.BaseExpression] = []
        if isinstance(small, cst.Assign):
            targets = [t.target for t in small.targets]
        elif isinstance(small, (cst.AugAssign, cst.AnnAssign)):
            targets = [small.target]
        while targets:
            target = targets.pop()
            if isinstance(target, (cst.Tuple, cst.List)):
                targets.extend(e.value for e in target.elements)
            else:
                key = name_key(target)
                if key:
                    keys.add(key)
    return keys


class AddAutocast(Transform):
    DESCRIPTION = "Run forward passes and losses under torch.autocast."
    code = "ACC301"

    @classmethod
    def enabled(cls, options: ConvertOptions) -> bool:
        # fsdp: MixedPrecisionPolicy casts the sharded parameters instead
        return options.amp != "off" and options.target != "fsdp"

    # -- analysis ---------------------------------------------------------------------
    def transform_module_impl(self, tree: cst.Module) -> cst.Module:
        if not self.enabled(self.options):
            return tree  # also when called directly, outside the pipeline
        return super().transform_module_impl(tree)

    def visit_Module(self, node: cst.Module) -> None:
        self.dtype = "torch.float16" if self.options.amp == "fp16" else "torch.bfloat16"
        self.label = self.options.amp
        self.edits = _Edits()
        self.touched = False
        self._collect_names(node)
        self.dp_wrappers = wrapper_instances(node)
        self.planned_functions: set[cst.FunctionDef] = set()
        loops = list(self.script.step_loops.values())
        # Step loops of other modules whose step function is here (`mylib.train_step()`
        # called from the loop of train.py): this module's conversion wraps it.
        elsewhere = [
            loop
            for loop in self.script.training.step_loops.values()
            if loop.module is not self.script.module
            and loop.role is LoopRole.TRAIN
            and any(f.module is self.script.module for f in loop.step_functions)
        ]
        if (loops or elsewhere) and not self.script.uses_cuda:
            if loops:  # (the module of the loop says so for the others)
                self.skipped(
                    "autocast",
                    "the script never uses CUDA: mixed precision pays off on GPUs, while CPU"
                    " autocast is slower and less precise for most models",
                    loops[0].node,
                )
            return
        self.ran_models = self._ran_trained_models()
        for loop in loops:
            self._plan_loop(loop)
        for loop in elsewhere:
            if not self._under_autocast(loop):
                self._plan_step_functions(loop)

    def _ran_trained_models(self) -> set[cst.Call]:
        """The calls of this module where the run of the script (if any) called a model
        it trained: `model(x)` in a helper that receives the model (`train_epoch(loader,
        model, ...)` of another module), which the code alone does not show to be one.
        (Without them the second conversion would see the DDP wrapper the first one
        built, a model, and add the autocast the first one did not.)"""
        given = self.step_context.facts
        if given is None or self.script.index is None:
            return set()
        path = None if self.in_entry_script else self.context.filename
        facts = given.resolver(self.script.index.module, self.position_of, path)
        ran = {
            facts.node_at(forward.site)
            for model in facts.trained_models()
            for forward in facts.facts.forwards_of(model.id)
        }
        return {call for call in ran if call is not None}

    def _function_of(self, node: cst.CSTNode) -> cst.FunctionDef | None:
        return next((a for a in self.ancestors(node) if isinstance(a, cst.FunctionDef)), None)

    def _class_of(self, function: cst.FunctionDef | None) -> cst.ClassDef | None:
        if function is None:
            return None
        block = self.parent(function)
        owner = self.parent(block) if block is not None else None
        return owner if isinstance(owner, cst.ClassDef) else None

    def _collect_names(self, module: cst.Module) -> None:
        self.torch_devices: dict[str, set[cst.FunctionDef | None]] = {}
        self.bce_criteria: set[str] = set()
        self.bound: dict[cst.FunctionDef | None, set[str]] = {}
        self.local_functions = {f.name.value for f in find(module, cst.FunctionDef)}
        for assign in find(module, (cst.Assign, cst.AnnAssign)):
            value = assign.value
            if value is None:
                continue
            targets = (
                [t.target for t in assign.targets]
                if isinstance(assign, cst.Assign)
                else [assign.target]
            )
            scope = self._function_of(assign)
            calls = find(value, cst.Call)
            names = set().union(*(self.qualified_names(c.func) for c in calls)) if calls else set()
            for target in targets:
                key = name_key(target)
                if key is None:
                    continue
                self.bound.setdefault(scope, set()).add(key)
                if "torch.device" in names:
                    self.torch_devices.setdefault(key, set()).add(scope)
                if isinstance(value, cst.Call) and self.qualified_names(value.func) & _BCE:
                    self.bce_criteria.add(key)
        # Functions of the script that compute a BCE loss (`loss_function(recon, x, ...)`).
        self.bce_helpers = {
            f.name.value for f in find(module, cst.FunctionDef) if self._bce_calls(f.body)
        }

    def _device_expression(self, loop: cst.CSTNode) -> str:
        function = self._function_of(loop)
        if self._class_of(function) is not None and "self.device" in self.torch_devices:
            return "self.device.type"
        params = (
            {p.name.value for p in function.params.params + function.params.kwonly_params}
            if function is not None
            else set()
        )
        for key in sorted(self.torch_devices, key=lambda k: (k != "device", k)):
            if key.startswith("self."):
                continue
            scopes = self.torch_devices[key]
            if function is None:
                visible = None in scopes
            elif key in params:
                visible = key in self.script.devices
            else:
                visible = function in scopes or (
                    None in scopes and key not in self.bound.get(function, set())
                )
            if visible:
                return f"{key}.type"
        return _FALLBACK_DEVICE

    def _calls_model(self, node: cst.CSTNode) -> bool:
        return any(self._is_model_call(call) for call in find(node, cst.Call))

    def _is_model_call(self, node: cst.CSTNode) -> bool:
        return isinstance(node, cst.Call) and (
            name_key(node.func) in self.script.models or node in self.ran_models
        )

    def _is_loss(self, call: cst.Call) -> bool:
        return self._is_bce(call) or self.script.is_loss_call(call)

    def _is_bce(self, call: cst.Call) -> bool:
        return name_key(call.func) in self.bce_criteria or bool(
            self.qualified_names(call.func) & _BCE
        )

    def _bce_calls(self, node: cst.CSTNode) -> list[cst.Call]:
        return [c for c in find(node, cst.Call) if self._is_bce(c)]

    def _bce_helper(self, statements: list[cst.BaseStatement]) -> str | None:
        """The first function of the script computing a BCE loss that `statements` call."""
        return next(filter(None, (called_function(s, self.bce_helpers) for s in statements)), None)

    def _skip_for_bce_helper(self, helper: str, node: cst.CSTNode) -> None:
        self.skipped(
            "autocast",
            f"`{helper}()` computes binary_cross_entropy, which CUDA autocast rejects as"
            " unsafe and which fails on a bfloat16/float16 input outside it; wrap the"
            f" forward pass in torch.autocast by hand and call `{helper}()` after it on"
            " float32 inputs (`.float()`)",
            node,
        )

    @staticmethod
    def _under_autocast(loop: StepLoop) -> bool:
        """Whether the loop (of any module) is mixed precision already."""
        node = loop.node
        index = loop.module.index if loop.module is not None else None
        ancestors = index.ancestors(node) if index is not None else ()
        return any(_is_autocast_with(a) for a in ancestors) or any(
            _is_autocast_with(w) for w in find(node, cst.With)
        )

    def _calls_dp_wrapper(self, node: cst.CSTNode) -> bool:
        """A step of `--to dp`'s result: its forward pass and loss run in the wrapper's
        function, under the autocast that function has (if any), not around the call."""
        return any(name_key(c.func) in self.dp_wrappers for c in find(node, cst.Call))

    def _plan_loop(self, loop: StepLoop) -> None:
        node = loop.node
        if self._under_autocast(loop) or self._calls_dp_wrapper(node):
            return  # already mixed precision: leave the loop as the user wrote it
        body = node.body
        if not isinstance(body, cst.IndentedBlock):
            self.skipped("autocast", "the loop body is on the `for` line; wrap it by hand", node)
            return
        if loop.role is LoopRole.EVAL:
            self._plan_eval(node, body, self._device_expression(node))
        elif loop.step_functions:
            self._plan_step_functions(loop)
        else:
            self._plan_train(node, body, self._device_expression(node))

    def _plan_step_functions(self, loop: StepLoop) -> None:
        """Autocast in the functions of this module that the loop calls and that run
        `backward()` (`train_step`). A function of another module of the project is
        planned by that module's conversion, which sees the same loop."""
        for function in loop.step_functions:
            node = function.node
            if function.module is not self.script.module:
                if function.module.path is None and loop.module is self.script.module:
                    # no file: no conversion of its own will wrap it
                    self.skipped(
                        "autocast",
                        f"the training step `{function.name}()` is in `{function.module.name}`,"
                        " which is not a file of the project; wrap its forward pass and loss in"
                        f" `with torch.autocast(device_type=..., dtype={self.dtype})` by hand",
                        loop.node,
                    )
                continue
            if node in self.planned_functions:
                continue
            self.planned_functions.add(node)
            if not isinstance(node.body, cst.IndentedBlock):
                self.skipped(
                    "autocast",
                    f"the body of the training step `{function.name}()` is on the `def` line;"
                    " wrap its forward pass and loss by hand",
                    node,
                )
            elif self.options.amp == "fp16":
                self.skipped(
                    "autocast",
                    f"fp16 needs a GradScaler that lives across calls of `{function.name}()`;"
                    " use `--amp bf16`, or add autocast and a scaler by hand",
                    node,
                )
            elif not any(
                _is_autocast_with(w) for w in find(node, cst.With)
            ) and not self._calls_dp_wrapper(node):
                self._plan_train(node, node.body, self._device_expression(node.body.body[0]))

    def _micro_bodies(self, body: cst.IndentedBlock) -> list[cst.BaseSuite]:
        """The bodies of the micro-batch loops inside the step `body` (`for mx, my in
        zip(x.chunk(4), y.chunk(4)):`), outermost first."""
        return [
            loop.body
            for loop in find(body, (cst.For, cst.While))
            if loop in self.script.training.micro_loops
        ]

    def _plan_train(self, node: cst.CSTNode, body: cst.IndentedBlock, device: str) -> None:
        """Autocast the forward passes and losses before each `backward()` of `body`, or
        of the body of a micro-batch loop inside it, where that is where `backward()` is."""
        blocks: list[cst.BaseSuite] = [body, *self._micro_bodies(body)]
        direct = {
            s.body[0].value  # type: ignore[attr-defined]
            for block in blocks
            for s in block.body
            if _backward_target(s) is not None
        }
        nested = [c for c in method_calls(body, "backward") if c not in direct]
        if not direct or nested or any(not isinstance(b, cst.IndentedBlock) for b in blocks):
            self.skipped(
                "autocast",
                "`.backward()` is not a statement of the loop body itself nor of a"
                " micro-batch loop's body (it is nested in another block or expression);"
                " wrap the forward pass and loss in"
                f" `with torch.autocast(device_type=..., dtype={self.dtype})` by hand",
                node,
            )
            return
        optimizers_stepped = [
            c
            for c in method_calls(body, "step")
            if name_key(c.func.value) in self.script.optimizers  # type: ignore[attr-defined]
        ]
        fp16 = self.options.amp == "fp16"
        if fp16 and not optimizers_stepped:
            self.skipped(
                "autocast",
                "fp16 needs torch.amp.GradScaler, which can only step a torch.optim optimizer;"
                " this loop updates the parameters by hand (no `optimizer.step()`), so fp16"
                " autocast was not applied. Use `--amp bf16` (no scaler needed) or switch"
                " to a torch.optim optimizer",
                node,
            )
            return
        plans: list[tuple[cst.IndentedBlock, list[tuple[int, int]]]] = []
        changes: list[tuple[cst.CSTNode, str]] = []
        for block in blocks:
            assert isinstance(block, cst.IndentedBlock)
            wraps = self._train_wraps(list(block.body), changes)
            if wraps is None:
                return  # skipped, with the reason
            if wraps:
                plans.append((block, wraps))
        for changed, message in changes:
            self.changed(changed, message)
        for block, wraps in plans:
            self.edits.blocks[block] = _BlockPlan(wraps=wraps, device=device)
            self._cast_back(list(block.body), wraps)
        if fp16:
            self._plan_scaler(node, body, device, optimizers_stepped)

    def _train_wraps(
        self, statements: Statements, changes: list[tuple[cst.CSTNode, str]]
    ) -> list[tuple[int, int]] | None:
        """The (first, last) statements to put under autocast for each `backward()` of
        `statements` (none: no `backward()` there); None when one cannot be followed (the
        reason is logged). The changes to report go to `changes`."""
        wraps: list[tuple[int, int]] = []
        previous = -1
        for index, statement in enumerate(statements):
            target = _backward_target(statement)
            if target is None:
                continue
            key = name_key(target)
            if key is None:
                self.skipped(
                    "autocast",
                    f"cannot follow the tensor `{code_of(target)}` whose backward is called; wrap its computation by hand",
                    statement,
                )
                return None
            loss_at = next(
                (j for j in range(index - 1, previous, -1) if key in _assigned_keys(statements[j])),
                None,
            )
            if loss_at is None:
                self.skipped(
                    "autocast",
                    f"`{key}` is not computed in the same block as `{key}.backward()` (model"
                    " call and loss in different blocks); wrap the forward pass and loss in"
                    " torch.autocast by hand",
                    statement,
                )
                return None
            start = next(
                (j for j in range(previous + 1, loss_at + 1) if self._calls_model(statements[j])),
                None,
            )
            if start is None:
                # the forward pass is a method of the model (`-flow.log_probs(x).mean()`);
                # `--to ddp` calls it through a wrapper, a model call to a second conversion
                start = next(
                    (
                        j
                        for j in range(previous + 1, loss_at + 1)
                        if any(self.script.model_method(c) for c in find(statements[j], cst.Call))
                    ),
                    None,
                )
            if start is None and called_function(statements[loss_at], self.local_functions):
                start = loss_at
            if start is None:
                self.skipped(
                    "autocast",
                    f"no model call found before `{key}` is computed; wrap the forward pass"
                    " and loss in torch.autocast by hand",
                    statements[loss_at],
                )
                return None
            helper = self._bce_helper(statements[start : loss_at + 1])
            if helper is not None:
                self._skip_for_bce_helper(helper, statements[loss_at])
                return None
            end = loss_at
            bce = next(
                (j for j in range(start, loss_at + 1) if self._bce_calls(statements[j])), None
            )
            if bce is not None:
                end = bce - 1
                outside = (
                    "binary_cross_entropy computed outside torch.autocast on a float32"
                    " input (CUDA autocast rejects it as unsafe)"
                )
                changes.append((statements[bce], outside))
            if end >= start:
                wraps.append((start, end))
                changes.append(
                    (statements[start], f"forward pass and loss under torch.autocast({self.label})")
                )
            previous = index
        return wraps

    def _plan_eval(self, node: cst.CSTNode, body: cst.IndentedBlock, device: str) -> None:
        statements = list(body.body)
        wrapped = [
            index
            for index, statement in enumerate(statements)
            if isinstance(statement, cst.SimpleStatementLine) and self._calls_model(statement)
            # a model call and a BCE loss on one line: leave it in float32
            and not self._bce_calls(statement)
        ]
        if not wrapped:
            return
        after = [s for i, s in enumerate(statements) if i > wrapped[0] and i not in wrapped]
        helper = self._bce_helper(after)
        if helper is not None:
            self._skip_for_bce_helper(helper, node)
            return
        wraps: list[tuple[int, int]] = []
        for index in wrapped:
            if wraps and wraps[-1][1] == index - 1:
                wraps[-1] = (wraps[-1][0], index)
            else:
                wraps.append((index, index))
            self.changed(
                statements[index], f"evaluation forward pass under torch.autocast({self.label})"
            )
        self.edits.blocks[body] = _BlockPlan(wraps=wraps, device=device)
        self._cast_back(statements, wraps)

    def _cast_back(self, statements: Statements, wraps: list[tuple[int, int]]) -> None:
        """Mark `.float()` on the arguments of model and loss calls outside the blocks
        that carry a low-precision output of a block (a model's output or a value derived
        from one; a loss computed under autocast is float32 already)."""
        wrapped = {i for start, end in wraps for i in range(start, end + 1)}
        low_precision: set[str] = set()
        for index, statement in enumerate(statements):
            keys = _assigned_keys(statement)
            self._float_before_numpy(statement, low_precision, inside=index in wrapped)
            if index in wrapped:
                value = _assigned_value(statement)
                derived = self._calls_model(statement) or bool(_mentioned(value) & low_precision)
                if value is not None and derived and not self.script.is_loss_call(value):
                    low_precision |= keys
                else:
                    low_precision -= keys
                continue
            for call in find(statement, cst.Call):
                if not (self._is_model_call(call) or self._is_loss(call)):
                    continue
                for arg in call.args:
                    # a model called here, outside every block, returns float32
                    if _mentioned(arg.value) & low_precision and not self._is_model_call(arg.value):
                        self.edits.float_args.add(arg)
                        self.changed(
                            call,
                            f"`{code_of(arg.value)}` (an autocast output) cast back to float32"
                            " outside torch.autocast",
                        )
            low_precision -= keys

    def _float_before_numpy(
        self, statement: cst.CSTNode, low_precision: set[str], inside: bool
    ) -> None:
        """Mark `.numpy()` of an autocast output (a low-precision name, or, under autocast,
        a model's output) for `.float()` first: NumPy has no bfloat16, and `net(x).cpu()
        .numpy()` raised on CUDA (siamese-pytorch's evaluation, ninth unseen set)."""
        for call in find(statement, cst.Call):
            if not is_method_call(call, "numpy") or call.args:
                continue
            receiver = call.func.value  # type: ignore[attr-defined]
            if m.matches(receiver, m.Call(func=m.Attribute(attr=m.Name("float")), args=[])):
                continue  # cast already
            low = bool(_mentioned(receiver) & low_precision) or (
                inside and any(self._is_model_call(c) for c in find(receiver, cst.Call))
            )
            if low:
                self.edits.float_numpy.add(call)
                self.changed(
                    call,
                    f"`{code_of(receiver)}` (an autocast output) cast to float32 before"
                    " `.numpy()`, which has no bfloat16",
                )

    # -- fp16: GradScaler -----------------------------------------------------------
    def _plan_scaler(
        self, node: cst.CSTNode, body: cst.IndentedBlock, device: str, steps: list[cst.CSTNode]
    ) -> None:
        function = self._function_of(node)
        owner = self._class_of(function)
        scaler = "scaler"
        created = False
        if owner is not None and all(
            (name_key(c.func.value) or "").startswith("self.") for c in steps  # type: ignore[attr-defined]
        ):
            init = next(
                (
                    s
                    for s in owner.body.body
                    if isinstance(s, cst.FunctionDef) and s.name.value == "__init__"
                ),
                None,
            )
            keys = {name_key(c.func.value) for c in steps}  # type: ignore[attr-defined]
            assigns = [
                s
                for s in (find(init, cst.SimpleStatementLine) if init is not None else [])
                if _assigned_keys(s) & keys
            ]
            if assigns:
                scaler = "self.scaler"
                if "self.scaler" not in self.bound.get(init, set()):
                    self.edits.after.setdefault(assigns[-1], []).append(
                        f"self.scaler = torch.amp.GradScaler({device}, enabled={_on_cuda(device)})"
                    )
                    self.bound.setdefault(init, set()).add("self.scaler")
                    self.changed(assigns[-1], "create torch.amp.GradScaler for fp16 training")
                created = True
        if not created:
            epochs = [a for a in self.ancestors(node) if a in self.script.epoch_loops]
            anchor = epochs[-1] if epochs else node
            self.edits.before.setdefault(anchor, []).append(
                f"scaler = torch.amp.GradScaler({device}, enabled={_on_cuda(device)})"
            )
            self.changed(anchor, "create torch.amp.GradScaler for fp16 training")
            if not epochs and function is not None:
                self.skipped(
                    "GradScaler",
                    f"the scaler is created in `{function.name.value}()`, which holds only the"
                    " step loop, so its loss scale restarts at every call; create it once"
                    " outside and pass it in to keep the scale across epochs",
                    node,
                )
        statements = find(body, cst.SimpleStatementLine)
        last_step = None
        for statement in statements:
            small = statement.body[0] if len(statement.body) == 1 else None
            if _backward_target(statement) is not None:
                self.edits.replace[small] = f"backward:{scaler}"  # type: ignore[index]
                self.edits.scaler[statement] = scaler
            elif m.matches(small, m.Expr(value=m.Call(func=m.Attribute(attr=m.Name("step")), args=[]))) and name_key(small.value.func.value) in self.script.optimizers:  # type: ignore[union-attr]
                self.edits.replace[small] = f"step:{scaler}"  # type: ignore[index]
                last_step = statement
            clips = [c for c in find(statement, cst.Call) if self.qualified_names(c.func) & _CLIP]
            if clips:
                optimizer = self._optimizer_after(statement, statements, steps)
                self.edits.before.setdefault(statement, []).append(
                    f"{scaler}.unscale_({optimizer})"
                )
                self.changed(statement, "unscale gradients before clipping (fp16 GradScaler)")
        if last_step is not None:
            self.edits.after.setdefault(last_step, []).append(f"{scaler}.update()")
        self.changed(node, "backward and optimizer step through torch.amp.GradScaler (fp16)")

    def _optimizer_after(
        self, clip: cst.CSTNode, statements: list[cst.SimpleStatementLine], steps: list[cst.CSTNode]
    ) -> str:
        seen = False
        for statement in statements:
            if statement is clip:
                seen = True
            elif seen:
                for call in method_calls(statement, "step"):
                    if call in steps:
                        return code_of(call.func.value)  # type: ignore[attr-defined]
        return code_of(steps[0].func.value)  # type: ignore[attr-defined]

    # -- rewriting ------------------------------------------------------------------
    def edited(self) -> list[cst.CSTNode]:
        edits = self.edits
        return [
            *edits.blocks,
            *edits.before,
            *edits.after,
            *edits.replace,
            *edits.float_args,
            *edits.float_numpy,
        ]

    def leave_Expr(self, original_node: cst.Expr, updated_node: cst.Expr) -> cst.Expr:
        kind = self.edits.replace.get(original_node)
        if kind is None:
            return updated_node
        what, scaler = kind.split(":")
        call = updated_node.value
        assert isinstance(call, cst.Call) and isinstance(call.func, cst.Attribute)
        self.touched = True
        if what == "backward":
            scaled = cst.parse_expression(f"{scaler}.scale(x)").with_changes(
                args=[cst.Arg(call.func.value)]
            )
            return updated_node.with_changes(
                value=call.with_changes(func=call.func.with_changes(value=scaled))
            )
        step = cst.parse_expression(f"{scaler}.step(x)").with_changes(
            args=[cst.Arg(call.func.value)]
        )
        return updated_node.with_changes(value=step)

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.Call:
        if original_node not in self.edits.float_numpy:
            return updated_node
        self.touched = True
        func = updated_node.func
        assert isinstance(func, cst.Attribute)
        floated = cst.Call(func=cst.Attribute(value=func.value, attr=cst.Name("float")))
        return updated_node.with_changes(func=func.with_changes(value=floated))

    def leave_Arg(self, original_node: cst.Arg, updated_node: cst.Arg) -> cst.Arg:
        value = updated_node.value
        if original_node not in self.edits.float_args or m.matches(
            value, m.Call(func=m.Attribute(attr=m.Name("float")), args=[])
        ):
            return updated_node
        self.touched = True
        if not isinstance(value, (cst.Name, cst.Attribute, cst.Call, cst.Subscript)):
            value = value.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
        floated = cst.Call(func=cst.Attribute(value=value, attr=cst.Name("float")))
        return updated_node.with_changes(value=floated)

    def _rebuild(
        self, originals: Statements, updated: Statements, plan: _BlockPlan | None
    ) -> Statements:
        units: list[Statements] = []
        for original, new in zip(originals, updated):
            unit: Statements = []
            for code in self.edits.before.get(original, []):
                unit.append(cst.parse_statement(code + "\n"))
            unit.append(new)
            for code in self.edits.after.get(original, []):
                unit.append(cst.parse_statement(code + "\n"))
            if unit[0] is not new:
                self.touched = True
                # the first statement of the unit carries the blank lines and comments
                unit[unit.index(new)] = new.with_changes(leading_lines=[])
                unit[0] = unit[0].with_changes(leading_lines=new.leading_lines)
            elif len(unit) > 1:
                self.touched = True
            units.append(unit)
        if plan is None or not plan.wraps:
            return [s for unit in units for s in unit]
        result: Statements = []
        index = 0
        for start, end in plan.wraps:
            while index < start:
                result.extend(units[index])
                index += 1
            inner = [s for unit in units[start : end + 1] for s in unit]
            leading = inner[0].leading_lines
            inner[0] = inner[0].with_changes(leading_lines=[])
            with_node = cst.parse_statement(
                f"with torch.autocast(device_type={plan.device}, dtype={self.dtype},"
                f" enabled={_on_cuda(plan.device)}):\n    pass\n"
            )
            assert isinstance(with_node, cst.With)
            result.append(
                with_node.with_changes(body=cst.IndentedBlock(body=inner), leading_lines=leading)
            )
            self.touched = True
            index = end + 1
        while index < len(units):
            result.extend(units[index])
            index += 1
        return result

    def leave_IndentedBlock(
        self, original_node: cst.IndentedBlock, updated_node: cst.IndentedBlock
    ) -> cst.IndentedBlock:
        if len(original_node.body) != len(updated_node.body):
            return updated_node  # another edit flattened statements here: indices unknown
        body = self._rebuild(
            list(original_node.body), list(updated_node.body), self.edits.blocks.get(original_node)
        )
        return updated_node.with_changes(body=body)

    def leave_Module(self, original_node: cst.Module, updated_node: cst.Module) -> cst.Module:
        if len(original_node.body) == len(updated_node.body):
            updated_node = updated_node.with_changes(
                body=self._rebuild(list(original_node.body), list(updated_node.body), None)
            )
        if self.touched:
            updated_node = add_imports(updated_node, ("torch",))
        return updated_node
