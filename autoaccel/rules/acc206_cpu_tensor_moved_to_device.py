"""ACC206: a tensor built on the CPU by a factory and then copied to the device."""

from __future__ import annotations

import libcst as cst

from autoaccel.analysis.names import name_key
from autoaccel.analysis.shapes import is_attribute
from autoaccel.analysis.script_model import Missing
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
RANDOM = frozenset(
    {"rand", "randn", "randint", "randperm"}
)
FACTORIES = {f"torch.{name}": name for name in DETERMINISTIC | RANDOM}


class CpuTensorMovedToDevice(LintRule):
    code = "ACC206"
    name = "cpu-tensor-moved-to-device"
    message = "Tensor is built on the CPU and then copied to the device"
    fix_title = "Create the tensor on the device with `device=`"
    unsafe_for = "random factories (CUDA draws other numbers)"

    VALID = [
        "import torch\nx = torch.zeros(8, device='cuda')\n",
        "import torch\ndevice = torch.device('cuda')\nx = torch.zeros(8, device=device).to(device)\n",
        # `.to(...)` with something that may be a dtype or a tensor is not a move we can see.
        "import torch\nx = torch.zeros(8).to(torch.float16)\n",
        "import torch\nx = torch.zeros(8).to(other)\n",
        "import torch\nx = torch.zeros(8).to('cpu')\n",
        "import torch\nx = torch.zeros(8).to(torch.device('cpu'))\n",
        # A device passed through `**kwargs` cannot be seen.
        "import torch\nx = torch.zeros(8, **options).cuda()\n",
        # Not a factory that takes `device=`.
        "import torch\nx = torch.from_numpy(a).cuda()\n",
        # `*_like` builds on the device of its argument, which may already be the target.
        "import torch\nu = torch.zeros_like(emb).to(emb.device)\n",
        # Data from the host is copied from the host either way (`device=` copies too).
        "import torch\nx = torch.tensor([0.5, 0.5]).cuda()\n",
        # A user's own function of the same name.
        "def zeros(n):\n    return [0] * n\nx = zeros(8).cuda()\n",
        "import torch\nfrom mylib import zeros\nx = zeros(8).cuda()\n",
    ]
    INVALID = [
        Invalid(
            "import torch\nx = torch.zeros(8).cuda()\n",
            fixed='import torch\nx = torch.zeros(8, device="cuda")\n',
        ),
        Invalid(
            "import torch\ndevice = torch.device('cuda')\nx = torch.ones(2, 3).to(device)\n",
            fixed="import torch\ndevice = torch.device('cuda')\nx = torch.ones(2, 3, device=device)\n",
        ),
        Invalid(
            "from torch import arange\ny = arange(8).to(device='cuda:0')\n",
            fixed="from torch import arange\ny = arange(8, device='cuda:0')\n",
        ),
        Invalid(
            "import torch\nnoise = torch.randn(4, 100).to(x.device)\n",
            fixed="import torch\nnoise = torch.randn(4, 100, device=x.device)\n",
        ),
        # A dtype or `non_blocking` on the move: reported, not rewritten.
        Invalid("import torch\nx = torch.zeros(8).to('cuda', torch.float16)\n"),
        Invalid("import torch\nx = torch.zeros(8).cuda(non_blocking=True)\n"),
    ]

    def visit_Call(self, node: cst.Call) -> None:
        if not is_attribute(node.func, "cuda", "to") or not isinstance(
            node.func.value, cst.Call  # type: ignore[attr-defined]
        ):
            return
        factory: cst.Call = node.func.value  # type: ignore[attr-defined]
        names = sorted(
            FACTORIES[n] for n in self.qualified_names(factory.func) if n in FACTORIES
        )
        if not names:
            return
        if not isinstance(
            self.script.keyword(factory, "device"), Missing
        ) or not isinstance(self.script.keyword(factory, "out"), Missing):
            return
        target = self._target(node)
        if target is None:
            return
        edits = {}
        if isinstance(target, cst.BaseExpression):
            fixed = set_keyword(factory, "device", target)
            edits[node] = fixed.with_changes(lpar=node.lpar, rpar=node.rpar)
        self.report(
            node,
            f"`torch.{names[0]}(...)` builds the tensor on the CPU and then copies it to the device",
            edits=edits,
            # The CUDA generator draws other numbers than the CPU one: see the doc.
            applicability=Applicability.UNSAFE if names[0] in RANDOM else None,
        )

    def _target(self, move: cst.Call) -> cst.BaseExpression | bool | None:
        """The device `move` copies to: an expression when the move is plain (fixable),
        True when it is a device move with other arguments, None when it is not one."""
        method = move.func.attr.value  # type: ignore[attr-defined]
        args = move.args
        if any(arg.star for arg in args):
            return None
        if method == "cuda":
            return cst.SimpleString('"cuda"') if not args else True
        device = next(
            (a.value for a in args if a.keyword and a.keyword.value == "device"), None
        )
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
            on_cpu = (
                isinstance(first, cst.SimpleString) and first.evaluated_value == "cpu"
            )
            return "torch.device" in self.qualified_names(value.func) and not on_cpu
        key = name_key(value)
        return key is not None and key in self.script.devices
