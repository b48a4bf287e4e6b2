"""ACC501: `torch.autograd.Variable(...)`, a wrapper that does nothing since PyTorch 0.4."""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst
from libcst.metadata import ParentNodeProvider

from autoaccel.analysis.shapes import is_false, is_true
from autoaccel.cst_edit import as_receiver, bound_name, code_of, replacing
from autoaccel.lint.rule import Invalid, LintRule

VARIABLE = ("torch.autograd.Variable",)
_VARIABLE_MODULES = ("torch.autograd", "torch.autograd.variable")
_PARAMETERS = ("data", "requires_grad", "volatile")  # 0.3's signature, in order


@dataclass(frozen=True)
class VariableCall:
    """The arguments of a `Variable(data, requires_grad=False, volatile=False)` call."""

    data: cst.BaseExpression
    requires_grad: cst.BaseExpression | None
    volatile: cst.BaseExpression | None


def parse_variable_call(call: cst.Call) -> VariableCall | None:
    """The call's arguments, or None when they cannot be read (`*args`, `name=`)."""
    values: dict[str, cst.BaseExpression] = {}
    positional = 0
    for arg in call.args:
        if arg.star:
            return None
        if arg.keyword is None:
            if positional == len(_PARAMETERS):
                return None
            name = _PARAMETERS[positional]
            positional += 1
        else:
            name = arg.keyword.value
            if name not in _PARAMETERS:
                return None
        values[name] = arg.value
    if "data" not in values:
        return None  # `Variable()` makes an empty tensor
    return VariableCall(values["data"], values.get("requires_grad"), values.get("volatile"))


@dataclass(frozen=True)
class SelfAssignment:
    """`data, target = Variable(data), Variable(target)`: once unwrapped, `x = x`."""

    plain: list[cst.Call]  # `Variable(x)`
    volatile: list[cst.Call]  # `Variable(x, volatile=...)`


def self_assignment(rule: LintRule, line: cst.SimpleStatementLine) -> SelfAssignment | None:
    """The `Variable` calls of a statement that assigns names their own (wrapped) values,
    when it can go as a whole: a single assignment, no comment to lose."""
    if len(line.body) != 1 or not isinstance(line.body[0], cst.Assign):
        return None
    assign = line.body[0]
    if len(assign.targets) != 1:
        return None
    target, value = assign.targets[0].target, assign.value
    if isinstance(target, cst.Tuple) and isinstance(value, cst.Tuple):
        if len(target.elements) != len(value.elements):
            return None
        pairs = [(t.value, v.value) for t, v in zip(target.elements, value.elements)]
        if any(isinstance(e, cst.StarredElement) for e in (*target.elements, *value.elements)):
            return None
    else:
        pairs = [(target, value)]
    found = SelfAssignment([], [])
    for name, wrapped in pairs:
        if not isinstance(name, cst.Name):
            return None
        if isinstance(wrapped, cst.Name) and wrapped.value == name.value:
            continue
        if not isinstance(wrapped, cst.Call) or not rule.calls(wrapped, *VARIABLE):
            return None
        args = parse_variable_call(wrapped)
        if (
            args is None
            or not (isinstance(args.data, cst.Name) and args.data.value == name.value)
            or not (args.requires_grad is None or is_false(args.requires_grad))
        ):
            return None
        if args.volatile is None or is_false(args.volatile):
            found.plain.append(wrapped)
        else:
            found.volatile.append(wrapped)
    if not (found.plain or found.volatile):
        return None
    if line.trailing_whitespace.comment or "#" in code_of(assign):
        return None  # a comment on the statement would go with it
    return found


def statement_removal(rule: LintRule, line: cst.SimpleStatementLine):
    """Edits that delete `line`; comment lines above it move onto the next statement.
    None when there is no next statement to carry them."""
    if not any(empty.comment for empty in line.leading_lines):
        return {line: cst.RemoveFromParent()}
    parent = rule.get_metadata(ParentNodeProvider, line, None)
    if not isinstance(parent, (cst.Module, cst.IndentedBlock)):
        return None
    body = list(parent.body)
    index = next(i for i, statement in enumerate(body) if statement is line)
    if index + 1 == len(body):
        return None
    following = body[index + 1]
    return {
        line: cst.RemoveFromParent(),
        following: following.with_changes(
            leading_lines=[*line.leading_lines, *following.leading_lines]
        ),
    }


class VariableWrapper(LintRule):
    code = "ACC501"
    name = "variable-wrapper"
    message = "`Variable` has been a no-op wrapper since PyTorch 0.4"
    fix_title = "Remove `Variable`"

    VALID = [
        "import torch\nx = torch.randn(3)\n",
        # A user's own `Variable`.
        "import torch\nfrom mylib import Variable\nv = Variable(torch.randn(3))\n",
        "import torch\nclass Variable:\n    pass\nv = Variable(torch.randn(3))\n",
        # The import is still used.
        "import torch\nfrom torch.autograd import Variable\nok = isinstance(x, Variable)\n",
    ]
    INVALID = [
        Invalid(
            "import torch\nfrom torch.autograd import Variable\nx = Variable(torch.randn(3))\n",
            fixed="import torch\nx = torch.randn(3)\n",
        ),
        Invalid(
            "import torch.autograd as ag\nx = ag.Variable(data, requires_grad=True)\n",
            fixed="import torch.autograd as ag\nx = data.detach().requires_grad_()\n",
        ),
        Invalid(
            "import torch\nh = torch.autograd.Variable(torch.zeros(2, 8), requires_grad=True)\n",
            fixed="import torch\nh = torch.zeros(2, 8).requires_grad_()\n",
        ),
        Invalid(
            "from torch.autograd import Variable, grad\ny = Variable(a + b) * 2\n",
            fixed="from torch.autograd import grad\ny = (a + b) * 2\n",
        ),
        # `volatile=` belongs to ACC502: reported, not fixed here.
        Invalid("from torch.autograd import Variable\nx = Variable(data, volatile=True)\n"),
    ]

    def __init__(self, script) -> None:
        super().__init__(script)
        self.handled: set[cst.Call] = set()  # reported with the statement around them

    def visit_SimpleStatementLine(self, node: cst.SimpleStatementLine) -> None:
        # `data, target = Variable(data), Variable(target)` goes as a whole.
        found = self_assignment(self, node)
        if found is None or found.volatile or not found.plain:
            return  # with a `volatile=` wrapper, the statement is ACC502's
        edits = statement_removal(self, node)
        if edits is not None:
            self.handled.update(found.plain)
            self.report(found.plain[0], edits=edits)

    def visit_Call(self, node: cst.Call) -> None:
        if node in self.handled or not self.calls(node, *VARIABLE):
            return
        args = parse_variable_call(node)
        if args is None:
            self.report(node)
            return
        if args.volatile is not None and not is_false(args.volatile):
            self.report(
                node, "`Variable(..., volatile=...)` is a no-op since PyTorch 0.4 (see ACC502)"
            )
            return
        parent = self.get_metadata(ParentNodeProvider, node, None)
        if args.requires_grad is None or is_false(args.requires_grad):
            replacement = replacing(node, parent, args.data)
        else:
            replacement = replacing(node, parent, _requiring_grad(self, args))
        self.report(node, edits={node: replacement})

    def visit_ImportFrom(self, node: cst.ImportFrom) -> None:
        # `from torch.autograd import Variable` left without uses by the fixes above
        # (the fixer lints again after each round, so this runs once the last use is gone).
        if node.relative or node.module is None or code_of(node.module) not in _VARIABLE_MODULES:
            return
        if isinstance(node.names, cst.ImportStar):
            return
        unused = [
            alias
            for alias in node.names
            if code_of(alias.name) == "Variable" and not self.index.is_read(node, bound_name(alias))
        ]
        if not unused:
            return
        kept = [alias for alias in node.names if alias not in unused]
        message = "`Variable` is imported but no longer used"
        if kept:
            last = node.names[-1]
            kept[-1] = kept[-1].with_changes(comma=last.comma)
            self.report(unused[0], message, edits={node: node.with_changes(names=kept)})
            return
        line = self.get_metadata(ParentNodeProvider, node, None)
        edits = None
        if isinstance(line, cst.SimpleStatementLine):
            if len(line.body) == 1:
                edits = statement_removal(self, line)
            else:
                edits = {node: cst.RemoveFromParent()}  # `import torch; from ... import Variable`
        self.report(unused[0], message, edits=edits)


def _requiring_grad(rule: LintRule, args: VariableCall) -> cst.BaseExpression:
    """`Variable(x, requires_grad=flag)`: a new leaf, as `x.detach().requires_grad_(flag)`;
    the `detach()` is left out when `x` is a fresh tensor nobody else holds."""
    receiver = as_receiver(args.data)
    if not _is_fresh(rule, args.data):
        receiver = cst.Call(func=cst.Attribute(value=receiver, attr=cst.Name("detach")))
    flag: list[cst.Arg] = []
    if not is_true(args.requires_grad):
        flag = [cst.Arg(value=args.requires_grad)]  # type: ignore[arg-type]
    return cst.Call(func=cst.Attribute(value=receiver, attr=cst.Name("requires_grad_")), args=flag)


def _is_fresh(rule: LintRule, data: cst.BaseExpression) -> bool:
    """A tensor made by the expression itself: `torch.zeros(...)`, `x.data`, `x.clone()`."""
    if isinstance(data, cst.Attribute):
        return data.attr.value == "data"
    if not isinstance(data, cst.Call):
        return False
    if isinstance(data.func, cst.Attribute) and data.func.attr.value in ("clone", "detach"):
        return True
    # A torch factory (`torch.zeros`, `torch.randn`, `torch.from_numpy`, `torch.FloatTensor`);
    # `torch.as_tensor(t)` may hand back `t` itself.
    return any(
        name.startswith("torch.") and name.count(".") == 1 and name not in _MAY_ALIAS
        for name in rule.qualified_names(data.func)
    )


_MAY_ALIAS = frozenset({"torch.as_tensor", "torch.asarray"})
