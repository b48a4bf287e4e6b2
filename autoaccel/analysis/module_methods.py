"""What the methods of a model's class do with its layers: whether a method other than
`forward` computes with them (a VAE's `decode(z)`), or only reads values and keeps books
(`init_hidden()`, `mean_loss()`). FSDP registers the first kind as forward methods; a
function given a DDP wrapper may call the second kind on the model itself."""

from __future__ import annotations

import libcst as cst

from autoaccel.analysis.names import name_key
from autoaccel.analysis.program import ClassInfo
from autoaccel.analysis.shapes import find, is_name

# Methods of `nn.Module` that compute nothing with its layers, called on the model itself
# where a function gets the wrapper: `unwrapped(model).state_dict()` has the original keys.
LOCAL_MODULE_METHODS = frozenset(
    {
        "state_dict", "load_state_dict", "named_parameters", "named_modules", "modules",
        "children", "named_children", "buffers", "named_buffers", "to", "cuda", "cpu",
        "half", "float", "double", "requires_grad_", "apply",
    }
)  # fmt: skip


def attribute_assignments(body: cst.CSTNode) -> list[tuple[str, cst.BaseExpression]]:
    """(attribute, value) of each assignment to an attribute of `self` in `body`:
    `self.x = v`, and each element of `self.a, self.b = a, b`."""
    found = []
    for assign in find(body, cst.Assign):
        for target in (t.target for t in assign.targets):
            pairs: list[tuple[cst.BaseExpression, cst.BaseExpression]] = [(target, assign.value)]
            if isinstance(target, cst.Tuple) and isinstance(assign.value, cst.Tuple):
                if len(target.elements) == len(assign.value.elements):
                    pairs = [
                        (t.value, v.value) for t, v in zip(target.elements, assign.value.elements)
                    ]
            found += [
                (t.attr.value, v)
                for t, v in pairs
                if isinstance(t, cst.Attribute) and is_name(t.value, "self")
            ]
    return found


def computes_with_layers(method: cst.FunctionDef, cls: ClassInfo) -> bool:
    """Whether `method` (of `cls`) calls something of `self` (a layer, another method) or
    hands an attribute of `self` to a call (`F.linear(x, self.weight)`). Not
    `self.parameters()` and the other methods of `nn.Module` that compute nothing (minGPT's
    `configure_optimizers()`, registered with FSDP, would gather the parameters and give the
    optimizer the whole ones, freed after the call, not the shards), nor what a
    bookkeeping attribute does (`self.totals.clear()`, `torch.zeros(1, n, self.hidden)`)."""
    return _computes(method, _bookkeeping(cls))


def computing_methods(cls: ClassInfo) -> set[str]:
    """The names of the methods of `cls` and its project bases of which a definition
    computes with the layers (see `computes_with_layers`)."""
    bookkeeping = _bookkeeping(cls)
    return {
        name
        for c in cls.mro()
        for name, function in c.methods.items()
        if _computes(function.node, bookkeeping)
    }


def _computes(method: cst.FunctionDef, bookkeeping: set[str]) -> bool:
    """`computes_with_layers`, given the class's bookkeeping attributes."""
    for call in find(method.body, cst.Call):
        root = call.func
        first = None  # the attribute of `self` the call starts from
        while isinstance(root, cst.Attribute):
            first = root.attr.value
            root = root.value
        if (
            isinstance(call.func, cst.Attribute)
            and call.func.attr.value not in _COMPUTES_NOTHING
            and is_name(root, "self")
            and first not in bookkeeping
        ):
            return True
        if any(
            isinstance(arg.value, cst.Attribute)
            and name_key(arg.value.value) == "self"
            and arg.value.attr.value not in bookkeeping
            for arg in call.args
        ):
            return True
    return False


# Methods of `nn.Module` a method of the model may call without computing with its layers.
_COMPUTES_NOTHING = LOCAL_MODULE_METHODS | {"parameters", "train", "eval", "zero_grad"}
# What a bookkeeping attribute is given: a number, a string, None, a display.
_BOOKKEEPING_VALUES = (
    cst.Integer, cst.Float, cst.SimpleString, cst.FormattedString, cst.Dict, cst.List, cst.Set,
    cst.Tuple, cst.DictComp, cst.ListComp, cst.SetComp,
)  # fmt: skip


def _bookkeeping(cls: ClassInfo) -> set[str]:
    """The attributes of `cls` (and of its project bases) that every assignment gives a
    number, a string, None, a display (`self.losses = {}`) or a parameter of `__init__`
    whose default is one (`self.hidden = hidden` of `hidden=16`): they hold no layer."""
    values: dict[str, list[cst.BaseExpression]] = {}
    plain: set[str] = set()  # parameters of `__init__` with such a default
    for c in cls.mro():
        for function in c.methods.values():
            for attribute, value in attribute_assignments(function.node.body):
                values.setdefault(attribute, []).append(value)
            if function.name == "__init__":
                plain |= {
                    p.name.value
                    for p in function.node.params.params
                    if p.default is not None and _is_plain(p.default)
                }
    return {
        attribute
        for attribute, assigned in values.items()
        if all(_is_plain(v) or (isinstance(v, cst.Name) and v.value in plain) for v in assigned)
    }


def _is_plain(value: cst.BaseExpression) -> bool:
    return isinstance(value, _BOOKKEEPING_VALUES) or is_name(value, "None")
