"""ACC302: mixed precision through deprecated APIs (`torch.cuda.amp`, `torch.cpu.amp`, apex)."""

from __future__ import annotations

import libcst as cst

from autoaccel.lint.rule import Invalid, LintRule

# Deprecated spelling -> (device type, the `torch.amp` callable that replaces it, the
# old signature's positional parameters: they become keywords, since the new callable
# takes the device type first).
_REPLACED = {
    "torch.cuda.amp.autocast": ("cuda", "torch.autocast", ("enabled", "dtype", "cache_enabled")),
    "torch.cuda.amp.autocast_mode.autocast": (
        "cuda",
        "torch.autocast",
        ("enabled", "dtype", "cache_enabled"),
    ),
    "torch.cpu.amp.autocast": ("cpu", "torch.autocast", ("enabled", "dtype", "cache_enabled")),
    "torch.cpu.amp.autocast_mode.autocast": (
        "cpu",
        "torch.autocast",
        ("enabled", "dtype", "cache_enabled"),
    ),
    "torch.cuda.amp.GradScaler": (
        "cuda",
        "torch.amp.GradScaler",
        ("init_scale", "growth_factor", "backoff_factor", "growth_interval", "enabled"),
    ),
    "torch.cuda.amp.grad_scaler.GradScaler": (
        "cuda",
        "torch.amp.GradScaler",
        ("init_scale", "growth_factor", "backoff_factor", "growth_interval", "enabled"),
    ),
}
APEX_AMP = "apex.amp."


class DeprecatedMixedPrecision(LintRule):
    code = "ACC302"
    name = "deprecated-mixed-precision"
    message = "Mixed precision through a deprecated API"
    fix_title = "Use `torch.amp` with the device type"

    VALID = [
        "import torch\nwith torch.autocast('cuda'):\n    y = model(x)\n",
        "import torch\nscaler = torch.amp.GradScaler('cuda')\n",
        "from torch.amp import autocast\nwith autocast('cuda', dtype=torch.bfloat16):\n    y = model(x)\n",
        # A project's own `amp` module.
        "import torch\nfrom mylib import amp\nmodel, opt = amp.initialize(model, opt)\n",
    ]
    INVALID = [
        Invalid(
            "import torch\nwith torch.cuda.amp.autocast():\n    y = model(x)\n",
            fixed='import torch\nwith torch.autocast("cuda"):\n    y = model(x)\n',
        ),
        Invalid(
            "from torch.cuda.amp import autocast\nwith autocast(enabled=use_amp):\n    y = model(x)\n",
            fixed="import torch\nfrom torch.cuda.amp import autocast\n"
            'with torch.autocast("cuda", enabled=use_amp):\n    y = model(x)\n',
        ),
        # Positional arguments of the old signature become keywords.
        Invalid(
            "import torch\nscaler = torch.cuda.amp.GradScaler(1024.0, enabled=fp16)\n",
            fixed='import torch\nscaler = torch.amp.GradScaler("cuda", init_scale=1024.0, enabled=fp16)\n',
        ),
        Invalid(
            "import torch.cpu.amp\nwith torch.cpu.amp.autocast(dtype=torch.bfloat16):\n    y = model(x)\n",
            fixed='import torch.cpu.amp\nwith torch.autocast("cpu", dtype=torch.bfloat16):\n'
            "    y = model(x)\n",
        ),
        # apex: reported; `autoaccel convert` rewrites the script to torch.amp.
        Invalid(
            "from apex import amp\nimport torch\nmodel, opt = amp.initialize(model, opt, opt_level='O1')\n"
        ),
        Invalid(
            "import torch\nimport apex\nwith apex.amp.scale_loss(loss, opt) as scaled_loss:\n"
            "    scaled_loss.backward()\n"
        ),
    ]

    def visit_Call(self, node: cst.Call) -> None:
        names = self.qualified_names(node.func)
        replaced = next((_REPLACED[n] for n in sorted(names) if n in _REPLACED), None)
        if replaced is not None:
            device, new, positional = replaced
            fixed = self._modernised(node, device, new, positional)
            self.report(
                node,
                f'`{_spelled(names)}` is deprecated; use `{new}("{device}", ...)`',
                edits={node: fixed} if fixed is not None else None,
                imports=("torch",),
            )
        elif any(n.startswith(APEX_AMP) for n in names):
            self.report(
                node,
                "apex.amp is deprecated and unmaintained; `torch.amp` (autocast and"
                " GradScaler) replaces it; `autoaccel convert` rewrites the script",
            )

    def _modernised(
        self, call: cst.Call, device: str, new: str, positional: tuple[str, ...]
    ) -> cst.Call | None:
        """`new("device", ...)` with the old positional arguments as keywords; None
        when an argument cannot be placed (`*args`, more positionals than known)."""
        args: list[cst.Arg] = [cst.Arg(cst.SimpleString(f'"{device}"'))]
        for index, arg in enumerate(call.args):
            if arg.star:
                return None
            if arg.keyword is None:
                if index >= len(positional):
                    return None
                arg = arg.with_changes(
                    keyword=cst.Name(positional[index]),
                    equal=cst.AssignEqual(
                        whitespace_before=cst.SimpleWhitespace(""),
                        whitespace_after=cst.SimpleWhitespace(""),
                    ),
                )
            args.append(arg)
        args = [a.with_changes(comma=cst.MaybeSentinel.DEFAULT) for a in args]
        return call.with_changes(func=cst.parse_expression(new), args=args)


def _spelled(names: frozenset[str] | set[str]) -> str:
    return min(names, key=len)
