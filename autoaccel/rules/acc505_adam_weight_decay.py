"""ACC505: `Adam(..., weight_decay=...)`, L2 regularisation bent by Adam's adaptive step."""

from __future__ import annotations

import libcst as cst

from autoaccel.analysis.script_model import Missing, Unknown
from autoaccel.analysis.shapes import is_method_call
from autoaccel.cst_edit import bound_name, code_of
from autoaccel.lint.rule import Applicability, Invalid, LintRule, Replacement

ADAM = "torch.optim.Adam"
_WEIGHT_DECAY_POSITION = 4  # Adam(params, lr, betas, eps, weight_decay, amsgrad)


class AdamWeightDecay(LintRule):
    code = "ACC505"
    name = "adam-weight-decay"
    message = (
        "`Adam` applies `weight_decay` as an L2 gradient term that its adaptive step "
        "rescales per parameter; decoupled weight decay (`AdamW`) regularises as intended"
    )
    fix_title = "Use `AdamW`"
    # AdamW's decay is `lr * weight_decay * param` per step, a different regulariser:
    # the same number does not give the same model.
    applicability = Applicability.UNSAFE
    # Opt-in: on real code 3 of 5 sampled findings were right; whether `weight_decay` is
    # meant as L2 regularisation is in the author's head, not in the code.
    default = False

    VALID = [
        "import torch\nopt = torch.optim.Adam(model.parameters(), lr=1e-3)\n",
        "import torch\nopt = torch.optim.Adam(model.parameters(), weight_decay=0)\n",
        "import torch\nopt = torch.optim.AdamW(model.parameters(), weight_decay=1e-2)\n",
        # Values that are visibly 0: a parameter's default, an argparse default.
        "import torch\ndef make(params, wd=0.0):\n"
        "    return torch.optim.Adam(params, weight_decay=wd)\n",
        "import argparse\nimport torch\nparser = argparse.ArgumentParser()\n"
        "parser.add_argument('--weight-decay', type=float, default=0)\nargs = parser.parse_args()\n"
        "opt = torch.optim.Adam(model.parameters(), weight_decay=args.weight_decay)\n",
        # A `**kwargs` dict we cannot see into.
        "import torch\nopt = torch.optim.Adam(model.parameters(), **opt_kwargs)\n",
        # Already decoupled (PyTorch 2.6+).
        "import torch\n"
        "opt = torch.optim.Adam(\n"
        "    model.parameters(), weight_decay=1e-2, decoupled_weight_decay=True\n)\n",
        "from mylib import Adam\nopt = Adam(model.parameters(), weight_decay=1e-4)\n",
    ]
    INVALID = [
        Invalid(
            "import torch.optim as optim\n"
            "opt = optim.Adam(model.parameters(), lr=1e-3, weight_decay=1e-4)\n",
            fixed="import torch.optim as optim\n"
            "opt = optim.AdamW(model.parameters(), lr=1e-3, weight_decay=1e-4)\n",
        ),
        Invalid(
            "from torch.optim import Adam, SGD\n"
            "opt = Adam(model.parameters(), 1e-3, (0.9, 0.999), 1e-8, 5e-4)\n",
            fixed="from torch.optim import AdamW, SGD\n"
            "opt = AdamW(model.parameters(), 1e-3, (0.9, 0.999), 1e-8, 5e-4)\n",
        ),
        # `Adam` is still used: `AdamW` is imported beside it.
        Invalid(
            "from torch.optim import Adam\n"
            "opt = Adam(model.parameters(), weight_decay=1e-4)\nprobe = Adam(head.parameters())\n",
            fixed="from torch.optim import Adam, AdamW\n"
            "opt = AdamW(model.parameters(), weight_decay=1e-4)\nprobe = Adam(head.parameters())\n",
        ),
        # A value set elsewhere: the script asks for weight decay.
        Invalid(
            "import torch\nopt = torch.optim.Adam(model.parameters(), weight_decay=args.wd)\n",
            fixed="import torch\n"
            "opt = torch.optim.AdamW(model.parameters(), weight_decay=args.wd)\n",
        ),
        Invalid(
            "import torch\nopts = dict(lr=1e-3, weight_decay=1e-5)\n"
            "opt = torch.optim.Adam(model.parameters(), **opts)\n",
            fixed="import torch\nopts = dict(lr=1e-3, weight_decay=1e-5)\n"
            "opt = torch.optim.AdamW(model.parameters(), **opts)\n",
        ),
    ]

    def __init__(self, script) -> None:
        super().__init__(script)
        self.argparse_defaults: dict[str, cst.BaseExpression] = {}  # dest -> default
        self.adam_calls: list[cst.Call] = []

    def visit_Call(self, node: cst.Call) -> None:
        if is_method_call(node, "add_argument"):
            self._record_argument(node)
        elif self.calls(node, ADAM):
            self.adam_calls.append(node)

    def leave_Module(self, original_node: cst.Module) -> None:
        # After the traversal: `add_argument` calls may come after the optimizer's.
        for call in self.adam_calls:
            self._check(call)

    def _record_argument(self, call: cst.Call) -> None:
        """`parser.add_argument("--weight-decay", default=0.0)` -> `weight_decay`: 0.0."""
        flags = [
            arg.value.evaluated_value
            for arg in call.args
            if arg.keyword is None and isinstance(arg.value, cst.SimpleString)
        ]
        default = next(
            (arg.value for arg in call.args if arg.keyword and arg.keyword.value == "default"),
            None,
        )
        dest = next(
            (arg.value for arg in call.args if arg.keyword and arg.keyword.value == "dest"), None
        )
        flag = next((f for f in flags if isinstance(f, str) and f.startswith("--")), None)
        name = (
            dest.evaluated_value
            if isinstance(dest, cst.SimpleString)
            else flag[2:].replace("-", "_") if flag is not None else None
        )
        if isinstance(name, str) and default is not None:
            self.argparse_defaults[name] = default

    def _is_zero(self, value: cst.BaseExpression) -> bool:
        """Visibly zero: `0`, a parameter defaulting to 0, an argparse default of 0."""
        if _is_number(value):
            return not _is_nonzero(value)
        if isinstance(value, cst.Attribute):
            default = self.argparse_defaults.get(value.attr.value)
            return default is not None and _is_number(default) and not _is_nonzero(default)
        if isinstance(value, cst.Name):
            for ancestor in self.ancestors(value):
                if isinstance(ancestor, cst.FunctionDef):
                    for param in (*ancestor.params.params, *ancestor.params.kwonly_params):
                        if param.name.value == value.value:
                            return (
                                param.default is not None
                                and _is_number(param.default)
                                and not _is_nonzero(param.default)
                            )
        return False

    def _check(self, node: cst.Call) -> None:
        weight_decay = self._weight_decay(node)
        if isinstance(weight_decay, (Missing, Unknown)) or self._is_zero(weight_decay):
            return
        decoupled = self.script.keyword(node, "decoupled_weight_decay")
        if not isinstance(decoupled, Missing) and not _is_literal(decoupled, "False"):
            return
        self.report(node, edits=self._edits(node.func), imports=self._imports(node.func))

    def _weight_decay(self, call: cst.Call):
        if any(arg.star == "*" for arg in call.args):
            return Unknown.UNKNOWN
        positional = [arg for arg in call.args if arg.keyword is None and not arg.star]
        if len(positional) > _WEIGHT_DECAY_POSITION:
            return positional[_WEIGHT_DECAY_POSITION].value
        return self.script.keyword(call, "weight_decay")

    # -- the fix ---------------------------------------------------------------------
    def _imports(self, func: cst.BaseExpression) -> tuple[str, ...]:
        if self._import_of(func) is None and not self._is_module_attribute(func):
            return ("torch",)  # written as `torch.optim.AdamW`
        return ()

    def _is_module_attribute(self, func: cst.BaseExpression) -> bool:
        """`optim.Adam` / `torch.optim.Adam`: `AdamW` lives beside it."""
        return isinstance(func, cst.Attribute) and "torch.optim" in self.qualified_names(func.value)

    def _edits(self, func: cst.BaseExpression) -> dict[cst.CSTNode, Replacement]:
        if self._is_module_attribute(func):
            return {func: func.with_changes(attr=cst.Name("AdamW"))}  # type: ignore[union-attr]
        found = self._import_of(func)
        if found is None:
            # Any other spelling (`torch.optim.adam.Adam`, an alias of an alias).
            return {func: cst.parse_expression("torch.optim.AdamW")}
        statement, alias, uses, adamw = found
        names = list(statement.names)  # type: ignore[arg-type]
        index = names.index(alias)
        if adamw is not None:
            edits: dict[cst.CSTNode, Replacement] = {func: cst.Name(adamw)}
            if uses == 1:  # the last use of `Adam` goes: so does its import
                del names[index]
                if not names:
                    edits[statement] = cst.RemoveFromParent()
                    return edits
                if index == len(names):
                    names[-1] = names[-1].with_changes(comma=alias.comma)
                edits[statement] = statement.with_changes(names=names)
            return edits
        new = cst.ImportAlias(name=cst.Name("AdamW"))
        if uses == 1:
            names[index] = new.with_changes(comma=alias.comma)
        else:
            comma = alias.comma
            if not isinstance(comma, cst.Comma) or not code_of(comma).strip(", "):
                names[index] = alias.with_changes(
                    comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
                )
            names.insert(index + 1, new.with_changes(comma=comma))
        return {func: cst.Name("AdamW"), statement: statement.with_changes(names=names)}

    def _import_of(self, func: cst.BaseExpression):
        """For `Adam` bound by `from torch.optim import Adam [as A]`: the statement,
        the alias, how many times the name is read, and the local name of `AdamW`
        when one is already imported from `torch.optim`."""
        if not isinstance(func, cst.Name):
            return None
        bindings = self.index.bindings(func.value, func)
        if len(bindings) != 1 or not _imports_from_optim(bindings[0]):
            return None
        (statement,) = bindings
        alias = next(
            a for a in statement.names if bound_name(a) == func.value  # type: ignore[union-attr]
        )
        if code_of(alias.name) != "Adam":
            return None
        adamw = None
        for other in self.index.bindings("AdamW", func):
            if _imports_from_optim(other) and any(
                code_of(a.name) == "AdamW" and bound_name(a) == "AdamW"
                for a in other.names  # type: ignore[union-attr]
            ):
                adamw = "AdamW"
            else:
                return None  # `AdamW` means something else here
        return statement, alias, self.index.reads(statement, func.value), adamw


def _imports_from_optim(statement: object) -> bool:
    return (
        isinstance(statement, cst.ImportFrom)
        and not statement.relative
        and statement.module is not None
        and code_of(statement.module) == "torch.optim"
        and not isinstance(statement.names, cst.ImportStar)
    )


def _is_literal(node: object, value: str) -> bool:
    return isinstance(node, cst.Name) and node.value == value


def _is_number(node: object) -> bool:
    return isinstance(node, (cst.Integer, cst.Float))


def _is_nonzero(node: object) -> bool:
    """A number written in the script that is not zero (`1e-4`, `5e-4`)."""
    if isinstance(node, (cst.Integer, cst.Float)):
        return node.evaluated_value != 0
    return False
