"""ACC201: a CUDA script that trains convolutions without cuDNN's autotuner."""

from __future__ import annotations

import libcst as cst
from libcst.metadata import ParentNodeProvider

from autoaccel.analysis.script_model import LoopRole
from autoaccel.cst_edit import leading_import_block
from autoaccel.lint.rule import Applicability, Invalid, LintRule

BENCHMARK = "torch.backends.cudnn.benchmark"
STATEMENT = "torch.backends.cudnn.benchmark = True\n"
# Settings that mean the user already chose how cuDNN picks algorithms.
_CHOSEN = frozenset(
    {BENCHMARK, "torch.backends.cudnn.deterministic", "torch.backends.cudnn.enabled"}
)
_DETERMINISTIC_CALL = "torch.use_deterministic_algorithms"
_CHOOSING_CALLS = (_DETERMINISTIC_CALL, "torch.backends.cudnn.flags")
CONVOLUTIONS = frozenset(
    f"torch.nn.{kind}{dims}d"
    for kind in ("Conv", "ConvTranspose", "LazyConv", "LazyConvTranspose")
    for dims in (1, 2, 3)
) | frozenset(f"torch.nn.functional.conv{dims}d" for dims in (1, 2, 3))

_SCRIPT = (
    "import torch\n"
    "import torch.nn as nn\n"
    "\n"
    "{}"
    "model = nn.Conv2d(3, 8, 3).cuda()\n"
    "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
    "for x in loader:\n"
    "    model(x.cuda()).sum().backward()\n"
)


class CudnnBenchmarkDisabled(LintRule):
    code = "ACC201"
    name = "cudnn-benchmark-disabled"
    message = "Convolutions train on CUDA without `torch.backends.cudnn.benchmark = True`"
    fix_title = "Set `torch.backends.cudnn.benchmark = True` after the imports"
    # The autotuner picks algorithms by timing them: results may differ in the last
    # bits between runs, the chosen algorithm may need more workspace memory, and
    # input shapes that change every step make it slower, not faster.
    applicability = Applicability.UNSAFE

    VALID = [
        _SCRIPT.format("torch.backends.cudnn.benchmark = True\n\n"),
        # The user asked for reproducible results or chose the setting.
        _SCRIPT.format("torch.backends.cudnn.deterministic = True\n\n"),
        _SCRIPT.format("torch.backends.cudnn.benchmark = False\n\n"),
        _SCRIPT.format("torch.backends.cudnn.benchmark = args.benchmark\n\n"),
        _SCRIPT.format("torch.use_deterministic_algorithms(True)\n\n"),
        "import torch.backends.cudnn as cudnn\n" + _SCRIPT.format("cudnn.benchmark = True\n\n"),
        "from torch.backends import cudnn\n" + _SCRIPT.format("cudnn.deterministic = True\n\n"),
        # No CUDA, no convolution, or no training.
        _SCRIPT.format("").replace(".cuda()", ""),
        _SCRIPT.format("").replace("nn.Conv2d(3, 8, 3)", "nn.Linear(3, 8)"),
        "import torch\nimport torch.nn as nn\nmodel = nn.Conv2d(3, 8, 3).cuda()\n"
        "with torch.no_grad():\n    out = model(x)\n",
        # A user's own class of that name.
        "import torch\nclass Conv2d:\n    pass\n"
        "model = Conv2d(3, 8, 3).cuda()\nmodel(x).sum().backward()\n",
        # Gradients of an input, not of a model's parameters (guidance in a pipeline).
        _SCRIPT.format("").replace("optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n", ""),
        _SCRIPT.format("").replace("model.parameters()", "[latents]"),
    ]
    INVALID = [
        Invalid(
            _SCRIPT.format(""),
            fixed=_SCRIPT.format("torch.backends.cudnn.benchmark = True\n\n"),
        ),
        # `torch` is not bound: it is imported.
        Invalid(
            '"""Train."""\nfrom torch import nn, optim\nmodel = nn.Conv2d(3, 8, 3).cuda()\n'
            "opt = optim.Adam(model.parameters())\nmodel(x).sum().backward()\n",
            fixed='"""Train."""\nimport torch\nfrom torch import nn, optim\n\n'
            "torch.backends.cudnn.benchmark = True\n"
            "model = nn.Conv2d(3, 8, 3).cuda()\nopt = optim.Adam(model.parameters())\n"
            "model(x).sum().backward()\n",
        ),
        # Explicitly not deterministic: nothing to protect.
        Invalid(
            _SCRIPT.format("torch.backends.cudnn.deterministic = False\n\n"),
            fixed=_SCRIPT.format(
                "torch.backends.cudnn.benchmark = True\n\n"
                "torch.backends.cudnn.deterministic = False\n\n"
            ),
        ),
    ]

    def __init__(self, script) -> None:
        super().__init__(script)
        self._first_convolution: cst.Call | None = None
        self._backward = False
        self._chosen = False
        self._deterministic: cst.CSTNode | None = None  # where determinism is asked for

    def visit_Call(self, node: cst.Call) -> None:
        if self._first_convolution is None and not self.qualified_names(node.func).isdisjoint(
            CONVOLUTIONS
        ):
            self._first_convolution = node
        elif self.calls(node, *_CHOOSING_CALLS):
            self._chosen = True
            if self.calls(node, _DETERMINISTIC_CALL):
                self._deterministic = node
        elif isinstance(node.func, cst.Attribute) and node.func.attr.value == "backward":
            self._backward = True

    def visit_Attribute(self, node: cst.Attribute) -> None:
        names = self.qualified_names(node)
        if names.isdisjoint(_CHOSEN):
            return
        if "torch.backends.cudnn.deterministic" in names:
            if _assigned_false(self, node):
                return  # `deterministic = False` leaves the choice open
            self._deterministic = node
        self._chosen = True

    def leave_Module(self, original_node: cst.Module) -> None:
        # Gradients of an input (guidance in an inference pipeline) or of a latent
        # tensor train no convolution.
        trains = self.trains_a_model() and (
            self._backward
            or any(loop.role is LoopRole.TRAIN for loop in self.script.step_loops.values())
        )
        if self._first_convolution is None or not (
            trains and self.script.uses_cuda and self.script.has_convolutions
        ):
            return
        if self._deterministic is not None:
            self.note(
                self._deterministic,
                "the script asks for deterministic cuDNN here; the autotuner picks"
                " algorithms by timing them, which would defeat that",
            )
        if self._chosen:
            return
        last_import = _last_leading_import(original_node)
        if last_import is None:
            self.report(self._first_convolution)
            return
        statement = cst.parse_statement(STATEMENT).with_changes(leading_lines=[cst.EmptyLine()])
        self.report(
            self._first_convolution,
            edits={last_import: cst.FlattenSentinel([last_import, statement])},
            imports=("torch",),
        )


def _assigned_false(rule: LintRule, node: cst.Attribute) -> bool:
    target = rule.get_metadata(ParentNodeProvider, node, None)
    assign = rule.get_metadata(ParentNodeProvider, target, None) if target else None
    return (
        isinstance(target, cst.AssignTarget)
        and isinstance(assign, cst.Assign)
        and isinstance(assign.value, cst.Name)
        and assign.value.value == "False"
    )


def _last_leading_import(module: cst.Module) -> cst.SimpleStatementLine | None:
    """The last statement of the import block at the top (after a docstring)."""
    start, end = leading_import_block(module)
    return module.body[end - 1] if end > start else None  # type: ignore[return-value]
