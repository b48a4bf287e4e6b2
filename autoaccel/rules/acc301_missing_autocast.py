"""ACC301: a CUDA training step whose forward pass runs entirely in float32."""

from __future__ import annotations

import libcst as cst
from libcst.metadata import PositionProvider

from autoaccel.analysis.names import name_key
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
    ]

    def visit_Module(self, node: cst.Module) -> None:
        self.chooses_precision = False

    def visit_Name(self, node: cst.Name) -> None:
        if node.value in _PRECISION_WORDS:
            self.chooses_precision = True

    def leave_Module(self, original_node: cst.Module) -> None:
        # No model's parameters go to an optimizer: gradients of an input (guidance
        # in a sampling loop) train nothing to speed up.
        if self.chooses_precision or not self.script.uses_cuda or not self.trains_a_model():
            return
        loops = [
            loop.node
            for loop in self.script.step_loops.values()
            if loop.role is LoopRole.TRAIN
        ]
        if not loops:
            return
        # A loop's position needs the whole loop generated: asked only to pick among several.
        first = loops[0] if len(loops) == 1 else min(loops, key=self._start)
        self.report(self._first_model_call(first) or first)

    def _start(self, node: cst.CSTNode) -> tuple[int, int]:
        position = self.get_metadata(PositionProvider, node).start
        return (position.line, position.column)

    def _first_model_call(self, loop: cst.CSTNode) -> cst.Call | None:
        for call in find(loop, cst.Call):
            key = name_key(call.func)
            if key is not None and key in self.script.models:
                return call
        return None
