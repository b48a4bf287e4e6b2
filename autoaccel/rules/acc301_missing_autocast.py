"""ACC301: a CUDA training step whose forward pass runs entirely in float32."""

from __future__ import annotations

from dataclasses import dataclass, field

import libcst as cst
from libcst.metadata import PositionProvider

from autoaccel.analysis.names import name_key
from autoaccel.analysis.options import OptionDefaults
from autoaccel.analysis.program import (
    ClassInfo,
    FunctionInfo,
    Kind,
    Obj,
    Program,
    SourceModule,
    argument,
)
from autoaccel.analysis.script_model import LoopRole
from autoaccel.analysis.shapes import find
from autoaccel.lint.rule import Invalid, LintRule

# Words that show the script already chooses its precision: autocast in any spelling
# (`torch.autocast`, `from torch.cuda.amp import autocast as ac`, `accelerator.autocast`),
# a GradScaler, half- or double-precision models or dtypes (autocast leaves float64
# alone), apex/accelerate mixed precision, or a command-line switch such as `args.amp`. This is evidence, not API resolution: a script
# that merely mentions one of them is left alone.
_PRECISION_WORDS = frozenset(
    {
        "autocast",
        "GradScaler",
        "amp",
        "half",
        "float16",
        "bfloat16",
        "fp16",
        "bf16",
        "double",
        "float64",
        "mixed_precision",
        "Accelerator",
    }
)
# The same words as parts of a snake_case name (`use_fp16`, `amp_enabled`): an option of
# the script's own precision path. (`half` alone is too common a word: `half_batch`.)
_PRECISION_PARTS = frozenset({"autocast", "amp", "float16", "bfloat16", "fp16", "bf16"})

# The GPU's ops:byte ratio below which a GEMM cannot use the Tensor Cores' math rate,
# whatever the batch: 125 TFLOPS FP16 Tensor Core / 900 GB/s on a V100, 138.9 FLOPS/B
# (NVIDIA, GPU Performance Background User's Guide, "Understanding Performance").
# A100 and H100 have higher ratios, so a layer below it is memory-bound on those too.
OPS_PER_BYTE = 139


@dataclass(frozen=True)
class _Gemm:
    """Where a layer's GEMM takes K (reduced) and N (output) from: `(position, keyword,
    default)` each; `kernel` multiplies K by the kernel's size; `gates` multiplies N."""

    k: tuple[int, str, int | None] | None
    n: tuple[int, str, int | None]
    kernel: tuple[int, str] | None = None
    gates: int = 1


_CONV = {
    f"torch.nn.{kind}{dims}d": _Gemm(
        (0, "in_channels", None), (1, "out_channels", None), (2, "kernel_size")
    )
    for kind in ("Conv", "ConvTranspose")
    for dims in (1, 2, 3)
}
_LAZY_CONV = {
    f"torch.nn.{kind}{dims}d": _Gemm(None, (0, "out_channels", None), (1, "kernel_size"))
    for kind in ("LazyConv", "LazyConvTranspose")
    for dims in (1, 2, 3)
}
_RNN = {
    f"torch.nn.{name}{cell}": _Gemm((0, "input_size", None), (1, "hidden_size", None), gates=gates)
    for name, gates in (("RNN", 1), ("LSTM", 4), ("GRU", 3))
    for cell in ("", "Cell")
}
GEMMS: dict[str, _Gemm] = {
    "torch.nn.Linear": _Gemm((0, "in_features", None), (1, "out_features", None)),
    "torch.nn.LazyLinear": _Gemm(None, (0, "out_features", None)),
    "torch.nn.Bilinear": _Gemm((0, "in1_features", None), (2, "out_features", None)),
    "torch.nn.MultiheadAttention": _Gemm((0, "embed_dim", None), (0, "embed_dim", None)),
    # the feed-forward block is the widest GEMM of a transformer layer
    "torch.nn.TransformerEncoderLayer": _Gemm((0, "d_model", None), (2, "dim_feedforward", 2048)),
    "torch.nn.TransformerDecoderLayer": _Gemm((0, "d_model", None), (2, "dim_feedforward", 2048)),
    "torch.nn.Transformer": _Gemm((0, "d_model", 512), (4, "dim_feedforward", 2048)),
    **_CONV,
    **_LAZY_CONV,
    **_RNN,
}
# Matrix work of sizes a layer call does not state.
_FUNCTIONAL_GEMMS = frozenset(
    {
        "torch.nn.functional.linear",
        "torch.nn.functional.bilinear",
        "torch.nn.functional.conv1d",
        "torch.nn.functional.conv2d",
        "torch.nn.functional.conv3d",
        "torch.nn.functional.scaled_dot_product_attention",
    }
)
_CONTAINERS = frozenset({"torch.nn.Sequential", "torch.nn.ModuleList", "torch.nn.ModuleDict"})
# GEMMs whose M is the batch: a linear layer on `[batch, features]` rows. Any other layer
# (a convolution's M is batch x output pixels, a sequence model's batch x tokens) or a
# table of embeddings means M is not the batch alone.
_ROW_GEMMS = frozenset({"torch.nn.Linear", "torch.nn.LazyLinear", "torch.nn.Bilinear"})
_SEQUENCES = frozenset({"torch.nn.Embedding", "torch.nn.EmbeddingBag"})
# A weight matrix of a layer of the project's own (`Parameter(torch.FloatTensor(k, n))`,
# multiplied with `torch.mm` in `forward`): a GEMM of K = k, N = n.
_PARAMETERS = frozenset({"torch.nn.Parameter", "torch.nn.parameter.Parameter"})
_PARAMETER_FACTORIES = frozenset(
    {
        "torch.empty",
        "torch.zeros",
        "torch.ones",
        "torch.rand",
        "torch.randn",
        "torch.Tensor",
        "torch.FloatTensor",
    }
)
_OPERATORS = {
    cst.Add: lambda a, b: a + b,
    cst.Subtract: lambda a, b: a - b,
    cst.Multiply: lambda a, b: a * b,
    cst.FloorDivide: lambda a, b: a // b if b else None,
    cst.Power: lambda a, b: a**b if 0 <= b < 64 else None,
}


class MissingAutocast(LintRule):
    code = "ACC301"
    name = "missing-autocast"
    message = (
        "CUDA training step runs its forward pass in float32 without `torch.autocast`; "
        "`autoaccel convert --amp bf16` adds mixed precision"
    )

    VALID = [
        "import torch\nmodel = Net().cuda()\nfor x, y in loader:\n"
        "    with torch.autocast('cuda', dtype=torch.bfloat16):\n"
        "        loss = criterion(model(x), y)\n    loss.backward()\n",
        "import torch\nfrom torch.cuda.amp import autocast as ac\nmodel = Net().cuda()\n"
        "for x, y in loader:\n    with ac():\n        loss = criterion(model(x), y)\n    loss.backward()\n",
        # Half-precision model: the precision is chosen already.
        "import torch\nmodel = Net().cuda().half()\nfor x, y in loader:\n"
        "    loss = criterion(model(x), y)\n    loss.backward()\n",
        # Double precision (an LBFGS fit): autocast does not touch float64.
        "import torch\nmodel = Net().double().cuda()\nfor x, y in loader:\n"
        "    loss = criterion(model(x), y)\n    loss.backward()\n",
        # A CPU-only script.
        "import torch\nmodel = Net()\nfor x, y in loader:\n    loss = criterion(model(x), y)\n"
        "    loss.backward()\n",
        # No training step.
        "import torch\nmodel = Net().cuda()\nwith torch.no_grad():\n    out = model(x)\n",
        # Gradients of an input (guidance while sampling), no model's parameters trained.
        "import torch\nunet = Net().cuda()\nfor t in timesteps:\n"
        "    x = x.detach().requires_grad_()\n    loss = criterion(unet(x), y)\n"
        "    loss.backward()\n    x = x - x.grad\n",
        # Layers too narrow for the Tensor Cores to pay (64 units).
        "import torch\nfrom torch import nn\nmodel = nn.Sequential(nn.Linear(obs_dim, 64), nn.Tanh(),"
        " nn.Linear(64, 2)).cuda()\nopt = torch.optim.Adam(model.parameters())\n"
        "for x, y in loader:\n    loss = criterion(model(x), y)\n    loss.backward()\n",
        # Its own loss scaling (an fp16 path of its own).
        "import torch\nmodel = Net().cuda()\nopt = torch.optim.Adam(model.parameters())\n"
        "for x, y in loader:\n    loss = criterion(model(x), y)\n    (loss * scale).backward()\n",
    ]
    INVALID = [
        Invalid(
            "import torch\nmodel = Net().cuda()\nopt = torch.optim.SGD(model.parameters())\n"
            "for x, y in loader:\n    loss = criterion(model(x), y)\n    loss.backward()\n"
        ),
        Invalid(
            "import torch\ndevice = torch.device('cuda')\nclass Trainer:\n"
            "    def __init__(self, net):\n        self.opt = torch.optim.Adam(net.parameters())\n"
            "    def fit(self):\n        while True:\n"
            "            loss = self.compute(next(it))\n            loss.backward()\n"
        ),
        # A layer wide enough: 1024 x 1024.
        Invalid(
            "import torch\nfrom torch import nn\nWIDTH = 1024\nclass Net(nn.Module):\n"
            "    def __init__(self, width=WIDTH):\n        super().__init__()\n"
            "        self.fc = nn.Linear(width, width)\n"
            "model = Net().cuda()\nopt = torch.optim.SGD(model.parameters())\n"
            "for x, y in loader:\n    loss = criterion(model(x), y)\n    loss.backward()\n"
        ),
    ]

    def visit_Module(self, node: cst.Module) -> None:
        self.chooses_precision = False
        self.names_xpu = False
        self.names_cuda = False

    def visit_Name(self, node: cst.Name) -> None:
        if node.value in _PRECISION_WORDS or not _PRECISION_PARTS.isdisjoint(node.value.split("_")):
            self.chooses_precision = True

    def visit_Call(self, node: cst.Call) -> None:
        func = node.func
        # `(loss * scale).backward()`: a loss scale of the script's own fp16 path
        if isinstance(func, cst.Attribute) and func.attr.value == "backward":
            receiver = func.value
            if isinstance(receiver, cst.BinaryOperation) and isinstance(
                receiver.operator, cst.Multiply
            ):
                self.chooses_precision = True
        if isinstance(func, cst.Attribute) and func.attr.value in ("cuda", "xpu"):
            self.names_cuda |= func.attr.value == "cuda"
            self.names_xpu |= func.attr.value == "xpu"
        elif any(n.startswith("torch.xpu.") for n in self.qualified_names(func)):
            self.names_xpu = True

    def visit_SimpleString(self, node: cst.SimpleString) -> None:
        text = node.evaluated_value
        if isinstance(text, str):
            device = text.split(":")[0]
            self.names_cuda |= device == "cuda"
            self.names_xpu |= device == "xpu"

    def leave_Module(self, original_node: cst.Module) -> None:
        # No model's parameters go to an optimizer: gradients of an input (guidance
        # in a sampling loop) train nothing to speed up.
        if self.chooses_precision or not self.script.uses_cuda or not self.trains_a_model():
            return
        if self.names_xpu and not self.names_cuda:
            return  # the device is only ever "xpu": no CUDA training step
        loops = [
            loop.node for loop in self.script.step_loops.values() if loop.role is LoopRole.TRAIN
        ]
        if not loops or not self._pays():
            return
        # A loop's position needs the whole loop generated: asked only to pick among several.
        first = loops[0] if len(loops) == 1 else min(loops, key=self._start)
        self.report(self._first_model_call(first) or first)

    def _pays(self) -> bool:
        """Whether a trained model may hold a GEMM wide enough for the Tensor Cores
        (True when its layers cannot be seen)."""
        program = self.script.program
        trained = self.script.training.trained
        if program is None or not trained:
            return True
        if not any(LayerSizes(program).model_pays(obj) for obj in trained):
            return False
        # With the batch known, a model of linear layers on rows has M = batch: the
        # GEMM's intensity M*K*N / (M*K + K*N + M*N) stays below M and below the bound
        # K*N / (K + N) used above.
        batch = self._batch_size(program)
        if batch is None:
            return True
        sizes = LayerSizes(program, batch)
        pays = any(sizes.model_pays(obj) for obj in trained)
        return pays or sizes.not_rows

    def _batch_size(self, program: Program) -> int | None:
        """The largest batch the DataLoaders of this module's training loops give, when
        each is written out (a literal, or the default of a command-line option)."""
        sizes = LayerSizes(program)
        found: list[int | None] = []
        for loop in self.script.step_loops.values():
            if loop.role is not LoopRole.TRAIN:
                continue
            if not loop.loaders:
                return None
            for loader in loop.loaders:
                value = argument(loader.node, 1, "batch_size")  # type: ignore[arg-type]
                frame = _Frame(loader.module, program.function_of.get(loader.node))
                found.append(None if value is None else sizes.int_of(value, frame))
        if not found or None in found:
            return None
        return max(found)  # type: ignore[type-var]

    def _start(self, node: cst.CSTNode) -> tuple[int, int]:
        position = self.get_metadata(PositionProvider, node).start
        return (position.line, position.column)

    def _first_model_call(self, loop: cst.CSTNode) -> cst.Call | None:
        for call in find(loop, cst.Call):
            key = name_key(call.func)
            if key is not None and key in self.script.models:
                return call
        return None


@dataclass(eq=False)
class _Frame:
    """Where integers are looked up: a function of the project (or a module's top
    level) and, for a constructor, the argument expressions its call passes."""

    module: SourceModule
    function: FunctionInfo | None = None
    args: dict[str, tuple[cst.BaseExpression, _Frame]] = field(default_factory=dict)


class LayerSizes:
    """The GEMM layers a model is built from, with their sizes where they are literal
    (through constructor arguments, defaults and single assignments)."""

    DEPTH = 8  # project classes nested deeper are not followed (treated as unknown)

    def __init__(self, program: Program, batch: int | None = None) -> None:
        """`batch`: the M of the GEMMs of linear layers on rows, when known."""
        self.program = program
        self.batch = batch
        self.not_rows = False  # a layer was seen whose M is not the batch alone
        self.options = OptionDefaults(program)
        self.calls_of: dict[FunctionInfo | None, list[cst.Call]] = {}
        for call in program.calls:
            self.calls_of.setdefault(program.function_of.get(call), []).append(call)

    layer_names = frozenset(GEMMS)

    def outputs(self, layer: cst.Call, module: SourceModule) -> int | None:
        """The output width of a layer call written at the top level of `module` or in
        a method (its constructor's arguments unknown)."""
        names = module.index.qualified_names(layer.func)
        gemm = next((GEMMS[n] for n in names if n in GEMMS), None)
        if gemm is None:
            return None
        function = self.program.function_of.get(layer)
        return self._dimension(layer, gemm.n, _Frame(module, function))

    def model_pays(self, obj: Obj) -> bool:
        """Whether the model `obj` may hold a GEMM wide enough for the Tensor Cores."""
        if obj.cls is not None and obj.cls.is_module and isinstance(obj.node, cst.Call):
            return self._class_pays(obj.cls, self._bind(obj.cls, obj.node, _Frame(obj.module)), 0)
        if obj.kind is Kind.MODULE and isinstance(obj.node, cst.Call):
            names = obj.module.index.qualified_names(obj.node.func)
            if names & (GEMMS.keys() | _CONTAINERS):
                found = self._calls_pay(list(_calls_in(obj.node)), _Frame(obj.module), 0)
                return found is not False
        return True

    # -- what a class builds ---------------------------------------------------------
    def _class_pays(self, cls: ClassInfo, init: _Frame, depth: int) -> bool:
        if depth > self.DEPTH:
            return True
        gemms = False
        for owner in cls.mro():
            for method in owner.methods.values():
                frame = init if method.name == "__init__" else _Frame(method.module, method)
                found = self._calls_pay(self.calls_of.get(method, []), frame, depth)
                if found:
                    return True
                gemms |= found is False
        return not gemms  # no GEMM seen at all: what it computes with is unknown

    def _calls_pay(self, calls: list[cst.Call], frame: _Frame, depth: int) -> bool | None:
        """True when one of `calls` may build a wide (or unknown) GEMM, False when they
        build only narrow ones, None when they build none."""
        found: bool | None = None
        for call in calls:
            verdict = self._call_pays(call, frame, depth)
            if verdict:
                return True
            if verdict is False:
                found = False
        return found

    def _call_pays(self, call: cst.Call, frame: _Frame, depth: int) -> bool | None:
        module = frame.module
        names = module.index.qualified_names(call.func)
        gemm = next((GEMMS[n] for n in names if n in GEMMS), None)
        if gemm is not None:
            self.not_rows |= names.isdisjoint(_ROW_GEMMS)
            return self._gemm_pays(gemm, call, frame, rows=not names.isdisjoint(_ROW_GEMMS))
        if names & _PARAMETERS:
            return self._parameter_pays(call, frame)
        if names & _FUNCTIONAL_GEMMS:
            self.not_rows = True
            return True
        if names & _SEQUENCES:
            self.not_rows = True
        if any(n.startswith(("torch.", "builtins.", "numpy.", "math.")) for n in names):
            return None
        classes = [
            o.cls
            for o in self.program.values_of(call.func, module)
            if o.kind is Kind.CLASS and o.cls is not None
        ]
        if classes:
            verdicts = [
                self._class_pays(c, self._bind(c, call, frame), depth + 1)
                for c in classes
                if c.is_module
            ]
            return True if any(verdicts) else (False if verdicts else None)
        helpers = self.program.callees.get(call)
        if helpers:
            if self.batch is not None and depth <= self.DEPTH:
                # with M known, the layers a helper builds (`block(in_feat, out_feat)`)
                # are judged whatever their widths
                verdicts = [
                    self._calls_pay(self.calls_of.get(f, []), _Frame(f.module, f), depth + 1)
                    for f in helpers
                ]
                return True if any(verdicts) else (False if False in verdicts else None)
            return None  # a helper of the project: its layers are the calls it is passed
        # an object of a library outside torch held as a submodule (`GCNConv(...)`, a
        # backbone): its layers cannot be seen
        parent = module.index.parent(call)
        if isinstance(parent, cst.Assign) and _holds_self_attribute(parent):
            self.not_rows = True
            return True
        return None

    def _parameter_pays(self, call: cst.Call, frame: _Frame) -> bool | None:
        """`Parameter(torch.FloatTensor(k, n))`: a weight matrix (a GEMM); a vector (a
        bias) or a tensor of other shapes is none."""
        data = argument(call, 0, "data")
        if not isinstance(data, cst.Call) or frame.module.index.qualified_names(
            data.func
        ).isdisjoint(_PARAMETER_FACTORIES):
            return None
        dims = [a.value for a in data.args if a.keyword is None and not a.star]
        if len(dims) != 2 or len(data.args) != 2:
            return None
        matrix = _Gemm((0, "", None), (1, "", None))
        return self._gemm_pays(matrix, data, frame, rows=False)

    def _gemm_pays(self, gemm: _Gemm, call: cst.Call, frame: _Frame, rows: bool = False) -> bool:
        k = self._dimension(call, gemm.k, frame) if gemm.k is not None else None
        n = self._dimension(call, gemm.n, frame)
        if k is not None and gemm.kernel is not None:
            kernel = argument(call, *gemm.kernel)
            size = self._kernel_size(kernel, frame) if kernel is not None else None
            k = k * size if size is not None else None
        if n is not None:
            n *= gemm.gates
        # Arithmetic intensity of an M x N x K GEMM in 16 bits: MNK / (MK + KN + MN), which
        # stays below KN / (K + N) for every M, and below min(K, N).
        m = self.batch if rows else None
        if m is not None:
            # an unknown K or N taken as infinite: the bound MK / (M + K), or M
            known = [d for d in (k, n) if d is not None]
            if len(known) == 2:
                return m * k * n / (m * k + k * n + m * n) >= OPS_PER_BYTE  # type: ignore[operator]
            if known:
                return m * known[0] / (m + known[0]) >= OPS_PER_BYTE
            return m >= OPS_PER_BYTE
        if k is not None and n is not None:
            return k * n / (k + n) >= OPS_PER_BYTE if k + n else False
        known = k if k is not None else n
        return known is None or known >= OPS_PER_BYTE

    def _dimension(
        self, call: cst.Call, spec: tuple[int, str, int | None], frame: _Frame
    ) -> int | None:
        position, keyword, default = spec
        value = argument(call, position, keyword)
        return default if value is None else self._int(value, frame)

    def _kernel_size(self, value: cst.BaseExpression, frame: _Frame) -> int | None:
        if isinstance(value, cst.Tuple):
            size = 1
            for element in value.elements:
                part = self._int(element.value, frame)
                if part is None:
                    return None
                size *= part
            return size
        return self._int(value, frame)

    # -- integers ----------------------------------------------------------------------
    def int_of(self, value: cst.BaseExpression, frame: _Frame) -> int | None:
        """The integer `value` (an expression run in `frame`) is, when written out."""
        return self._int(value, frame)

    def _int(self, value: cst.BaseExpression, frame: _Frame, depth: int = 0) -> int | None:
        if depth > 20:
            return None
        if isinstance(value, cst.Integer):
            return int(value.evaluated_value)
        if isinstance(value, cst.BinaryOperation) and type(value.operator) in _OPERATORS:
            left = self._int(value.left, frame, depth + 1)
            right = self._int(value.right, frame, depth + 1)
            if left is None or right is None:
                return None
            return _OPERATORS[type(value.operator)](left, right)
        if isinstance(value, cst.Name):
            return self._name(value.value, frame, depth)
        default = self.options.default(value, frame.module)  # `args.hidden`
        if default is not None:
            return self._int(default, _Frame(frame.module), depth + 1)
        return None

    def _name(self, name: str, frame: _Frame, depth: int) -> int | None:
        if name in frame.args:
            expression, caller = frame.args[name]
            return self._int(expression, caller, depth + 1)
        function = frame.function
        top = _Frame(frame.module)
        if function is not None:
            params = function.node.params
            for param in (*params.posonly_params, *params.params, *params.kwonly_params):
                if param.name.value == name:
                    return (
                        None if param.default is None else self._int(param.default, top, depth + 1)
                    )
            assigned = _single_assignment(function.node.body, name)
            if assigned is not None:
                return self._int(assigned, frame, depth + 1)
        assigned = _single_assignment(frame.module.tree, name)
        return None if assigned is None else self._int(assigned, top, depth + 1)

    def _bind(self, cls: ClassInfo, call: cst.Call, caller: _Frame) -> _Frame:
        """The frame of `cls.__init__` called by `call` (an instantiation in `caller`)."""
        init = cls.method("__init__")
        if init is None:
            return _Frame(cls.module)
        frame = _Frame(init.module, init)
        positional = init.positional[1:] if init.is_method else init.positional
        index = 0
        for arg in call.args:
            if arg.star:
                break
            if arg.keyword is not None:
                frame.args[arg.keyword.value] = (arg.value, caller)
            elif index < len(positional):
                frame.args[positional[index]] = (arg.value, caller)
                index += 1
        return frame


def _calls_in(node: cst.CSTNode) -> list[cst.Call]:
    return find(node, cst.Call)


def _holds_self_attribute(assign: cst.Assign) -> bool:
    return any(
        isinstance(t.target, cst.Attribute)
        and isinstance(t.target.value, cst.Name)
        and t.target.value.value == "self"
        for t in assign.targets
    )


def _single_assignment(scope: cst.CSTNode, name: str) -> cst.BaseExpression | None:
    """The value of the one plain `name = value` in `scope` (not in nested functions or
    classes), when nothing else there binds `name`."""
    found: list[cst.BaseExpression] = []
    other = False

    class _Visitor(cst.CSTVisitor):
        def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
            return node is scope

        def visit_ClassDef(self, node: cst.ClassDef) -> bool:
            return False

        def visit_Assign(self, node: cst.Assign) -> None:
            nonlocal other
            for target in node.targets:
                if isinstance(target.target, cst.Name) and target.target.value == name:
                    if len(node.targets) == 1:
                        found.append(node.value)
                    else:
                        other = True
                elif any(n.value == name for n in find(target.target, cst.Name)):
                    other = True

        def visit_AugAssign(self, node: cst.AugAssign) -> None:
            nonlocal other
            other |= isinstance(node.target, cst.Name) and node.target.value == name

        def visit_For(self, node: cst.For) -> None:
            nonlocal other
            other |= any(n.value == name for n in find(node.target, cst.Name))

    scope.visit(_Visitor())
    return found[0] if len(found) == 1 and not other else None
