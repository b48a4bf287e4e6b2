"""ACC501: `torch.autograd.Variable(...)`, a wrapper that does nothing since PyTorch 0.4."""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst
from libcst.metadata import ParentNodeProvider

from autoaccel.analysis.index import descendants
from autoaccel.analysis.script_model import StepLoop
from autoaccel.analysis.shapes import find, is_attribute, is_false, is_method_call, is_name, is_true
from autoaccel.cst_edit import as_receiver, bound_name, code_of, keyword_value, replacing
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
        # Anything that may carry a graph keeps the `detach()` that `Variable` does.
        Invalid(
            "from torch.autograd import Variable, grad\ny = Variable(a + b) * 2\n",
            fixed="from torch.autograd import grad\ny = (a + b).detach() * 2\n",
        ),
        Invalid(
            "import torch\nfrom torch.autograd import Variable\nh = lin(x)\nv = Variable(h)\n",
            fixed="import torch\nh = lin(x)\nv = h.detach()\n",
        ),
        Invalid(
            "from torch.autograd import Variable\nv = Variable(h.clone(), requires_grad=True)\n",
            fixed="v = h.clone().detach().requires_grad_()\n",
        ),
        # A DataLoader's batches have no graph: the self-assignment goes.
        Invalid(
            "import torch\nfrom torch.autograd import Variable\n"
            "loader = torch.utils.data.DataLoader(dataset)\n"
            "for x, y in loader:\n    x = x.cuda()\n    x, y = Variable(x), Variable(y)\n"
            "    model(x, y).backward()\n",
            fixed="import torch\nloader = torch.utils.data.DataLoader(dataset)\n"
            "for x, y in loader:\n    x = x.cuda()\n    model(x, y).backward()\n",
        ),
        # ... unless the step gives the name another value first.
        Invalid(
            "import torch\nfrom torch.autograd import Variable\n"
            "loader = torch.utils.data.DataLoader(dataset)\n"
            "for x, y in loader:\n    x = encoder(x)\n    x = Variable(x)\n"
            "    model(x, y).backward()\n",
            fixed="import torch\nloader = torch.utils.data.DataLoader(dataset)\n"
            "for x, y in loader:\n    x = encoder(x)\n    x = x.detach()\n"
            "    model(x, y).backward()\n",
        ),
        Invalid(
            "import torch\nfrom torch.autograd import Variable\nx = Variable(torch.zeros(3, requires_grad=True))\n",
            fixed="import torch\nx = torch.zeros(3, requires_grad=True).detach()\n",
        ),
        # `volatile=` belongs to ACC502: reported, not fixed here.
        Invalid("from torch.autograd import Variable\nx = Variable(data, volatile=True)\n"),
    ]

    def __init__(self, script) -> None:
        super().__init__(script)
        self.handled: set[cst.Call] = set()  # reported with the statement around them

    def visit_SimpleStatementLine(self, node: cst.SimpleStatementLine) -> None:
        # `data, target = Variable(data), Variable(target)` goes as a whole, when
        # nothing it wraps can carry a graph (then `Variable`'s detach does nothing).
        found = self_assignment(self, node)
        if found is None or found.volatile or not found.plain:
            return  # with a `volatile=` wrapper, the statement is ACC502's
        if not all(graph_free(self, parse_variable_call(c).data) for c in found.plain):  # type: ignore[union-attr]
            return  # `x = x.detach()`, call by call
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
        if args.requires_grad is not None and not is_false(args.requires_grad):
            replacement = replacing(node, parent, _requiring_grad(self, args))
            self.report(node, edits={node: replacement})
        else:
            # `Variable(h)` is `h.detach()`: for a tensor with a graph, or one that
            # requires grad, dropping the wrapper would let gradients through.
            replacement = unwrapped(self, args.data)
            title = None if replacement is args.data else "Replace `Variable(x)` with `x.detach()`"
            self.report(node, edits={node: replacing(node, parent, replacement)}, fix_title=title)

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


def graph_free(rule: LintRule, data: cst.BaseExpression) -> bool:
    """Whether `data` certainly neither has an autograd graph nor requires grad,
    so that `Variable(data)`, which is `data.detach()`, changes nothing."""
    return _made_without_graph(rule, data) or _batch(rule, data, set())


def unwrapped(rule: LintRule, data: cst.BaseExpression) -> cst.BaseExpression:
    """What `Variable(data)` is without the wrapper: `data` where it has no graph,
    else `data.detach()`."""
    return data if graph_free(rule, data) else _method(as_receiver(data), "detach")


def _batch(rule: LintRule, data: cst.BaseExpression, seen: set[str]) -> bool:
    """`x`, `x[0]`, `x.cuda()`, `x.to(device).float()`... for `x` a batch of the
    DataLoader the enclosing step loop reads, not given another value in the loop."""
    while True:
        if isinstance(data, cst.Subscript):
            data = data.value
        elif is_method_call(data, *_KEEPS_GRAPH_FREE):
            data = data.func.value  # type: ignore[attr-defined]
        else:
            break
    if _made_without_graph(rule, data):
        return True
    if not isinstance(data, cst.Name):
        return False
    loop = _loader_loop(rule, data)
    if loop is None:
        return False
    if data.value in seen:
        return True  # `x = x.cuda()`: graph-free if every other value of `x` is
    seen = seen | {data.value}
    values = _values_given_in(loop.node.body, data.value)
    return values is not None and all(
        v is not None and (_is_plain_variable(rule, v) or _batch(rule, v, seen)) for v in values
    )


def _is_plain_variable(rule: LintRule, value: cst.BaseExpression) -> bool:
    """`Variable(x)` without `requires_grad=True`: a detached value, whatever `x` is."""
    if not (isinstance(value, cst.Call) and rule.calls(value, *VARIABLE)):
        return False
    args = parse_variable_call(value)
    return args is not None and (args.requires_grad is None or is_false(args.requires_grad))


def _loader_loop(rule: LintRule, name: cst.Name) -> StepLoop | None:
    """The step loop over a DataLoader whose target binds `name`, read in its body
    (in the loop's own scope: not a lambda's or a nested function's parameter)."""
    loop = rule.enclosing_step_loop(name)
    if (
        loop is None
        or not isinstance(loop.node, cst.For)
        or not loop.loaders
        or name.value not in loop.batch_names
        or loop.node.body not in rule.ancestors(name)  # not its `else:`
        or rule.index.scopes.get(name) is not rule.index.scopes.get(loop.node)
    ):
        return None
    return loop


def _requiring_grad(rule: LintRule, args: VariableCall) -> cst.BaseExpression:
    """`Variable(x, requires_grad=flag)`: a new leaf, as `x.detach().requires_grad_(flag)`;
    the `detach()` is left out when `x` is a fresh tensor without a graph that nobody
    else holds (`torch.zeros(...)`, `x.data`, `x.detach()`)."""
    receiver = as_receiver(args.data)
    if not _fresh(rule, args.data):
        receiver = _method(receiver, "detach")
    flag: list[cst.Arg] = []
    if not is_true(args.requires_grad):
        flag = [cst.Arg(value=args.requires_grad)]  # type: ignore[arg-type]
    return cst.Call(func=cst.Attribute(value=receiver, attr=cst.Name("requires_grad_")), args=flag)


def _method(receiver: cst.BaseExpression, name: str) -> cst.Call:
    return cst.Call(func=cst.Attribute(value=receiver, attr=cst.Name(name)))


def _fresh(rule: LintRule, data: cst.BaseExpression) -> bool:
    """A new tensor without a graph, made by the expression itself: `torch.zeros(...)`,
    `x.data`, `x.detach()`. Not `x.clone()` (a clone of a tensor with a graph has one)
    nor `torch.FloatTensor(h)` (the legacy constructors alias a tensor argument)."""
    if is_attribute(data, "data") or is_method_call(data, "detach"):
        return True
    return isinstance(data, cst.Call) and not rule.qualified_names(data.func).isdisjoint(FACTORIES)


def _made_without_graph(rule: LintRule, data: cst.BaseExpression) -> bool:
    """`_fresh`, and a factory not asked to make a tensor that requires grad; or
    arithmetic of such tensors and numbers (`torch.ones(2) * 2`)."""
    if isinstance(data, cst.BinaryOperation):
        return all(_made_without_graph(rule, side) for side in (data.left, data.right))
    if isinstance(data, cst.UnaryOperation):
        return _made_without_graph(rule, data.expression)
    if isinstance(data, (cst.Integer, cst.Float)):
        return True
    if not _fresh(rule, data):
        return False
    if not isinstance(data, cst.Call) or is_method_call(data, "detach"):
        return True
    requires_grad = keyword_value(data, "requires_grad")
    return not any(arg.star == "**" for arg in data.args) and (
        requires_grad is None or is_false(requires_grad)
    )


def _values_given_in(body: cst.CSTNode, name: str) -> list[cst.BaseExpression] | None:
    """The values `body` assigns to `name` (`name = v`, `name, y = v, w`); None when it
    changes `name` in another way: `+=`, a nested `for`, `with ... as name`, `del`, a
    `global`, an in-place method (`name.requires_grad_()`), `name.attr = ...`,
    `name[...] = ...`."""
    values: list[cst.BaseExpression] = []
    for node in descendants(body):
        if isinstance(node, cst.Assign):
            for target in node.targets:
                pairs = _pairs(target.target, node.value)
                for bound, value in pairs:
                    if is_name(bound, name):
                        values.append(value)
                    elif _changes(bound, name):
                        return None
        elif isinstance(node, (cst.AugAssign, cst.AnnAssign, cst.NamedExpr, cst.For, cst.CompFor)):
            if _changes(node.target, name):
                return None
        elif isinstance(node, (cst.AsName, cst.Del)):
            if _changes(node.name if isinstance(node, cst.AsName) else node.target, name):
                return None
        elif isinstance(node, (cst.NameItem, cst.Param, cst.FunctionDef, cst.ClassDef)):
            if is_name(node.name, name):
                return None
        elif is_method_call(node) and _in_place(node.func.attr.value):  # type: ignore[attr-defined]
            if is_name(
                node.func.value, name
            ):  # `name.requires_grad_()`  # type: ignore[attr-defined]
                return None
    return values


def _pairs(
    target: cst.BaseExpression, value: cst.BaseExpression
) -> list[tuple[cst.BaseExpression, cst.BaseExpression | None]]:
    """What each part of an assignment's target receives: `a, b = x, y` pairs `a` with
    `x`; a target that unpacks anything else gets None for its names."""
    if isinstance(target, (cst.Tuple, cst.List)):
        elements = (*target.elements, *getattr(value, "elements", ()))
        if (
            isinstance(value, (cst.Tuple, cst.List))
            and len(value.elements) == len(target.elements)
            and not any(isinstance(e, cst.StarredElement) for e in elements)
        ):
            return [
                p for t, v in zip(target.elements, value.elements) for p in _pairs(t.value, v.value)
            ]
        return [(t, None) for t in find(target, cst.Name)]
    return [(target, value)]


def _changes(target: cst.CSTNode, name: str) -> bool:
    """Whether assigning to `target` rebinds or mutates `name`: `name`, `(a, name)`,
    `name.attr`, `name[0]`."""
    return any(is_name(found, name) for found in find(target, cst.Name))


def _in_place(method: str) -> bool:
    return method.endswith("_") and not method.startswith("_")


# Factories whose result has no graph (unless `requires_grad=True`): a new tensor.
FACTORIES = frozenset(
    f"torch.{name}"
    for name in (
        "zeros", "ones", "empty", "full", "rand", "randn", "randint", "randperm", "arange",
        "range", "linspace", "logspace", "eye", "tensor", "from_numpy", "zeros_like",
        "ones_like", "empty_like", "full_like", "rand_like", "randn_like", "randint_like",
    )
)  # fmt: skip
# Tensor methods that make nothing requiring grad from a tensor that does not.
_KEEPS_GRAPH_FREE = (
    "cuda", "cpu", "to", "float", "double", "half", "bfloat16", "long", "int", "bool",
    "view", "reshape", "contiguous", "squeeze", "unsqueeze", "permute", "transpose", "t",
    "pin_memory", "type",
)  # fmt: skip
