"""The script model: what a training script is made of, found once per file.

Rules and convert transforms share it instead of each re-discovering which names
are DataLoaders, models, optimizers, criteria and devices, and which loops train
or evaluate. Objects are tracked by `name_key` (`loader`, `self.loader`), so
top-level code, functions that receive them as arguments and classes are alike.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from enum import Enum

import libcst as cst
from libcst.metadata import MetadataWrapper

from autoaccel.analysis.index import ModuleIndex, descendants, run_visitors
from autoaccel.analysis.losses import is_functional_loss
from autoaccel.analysis.shapes import BindingVisitor, bound_names, is_name
from autoaccel.analysis.names import name_key

DATALOADER = "torch.utils.data.DataLoader"
# `torch.nn.parallel.DataParallel` and its module-internal path canonicalise to this.
DATA_PARALLEL = "torch.nn.DataParallel"
DISTRIBUTED_DATA_PARALLEL = "torch.nn.parallel.DistributedDataParallel"
DISTRIBUTED_SAMPLER = "torch.utils.data.DistributedSampler"
CONVOLUTIONS = frozenset(
    f"torch.nn.{kind}{dims}d"
    for kind in ("Conv", "ConvTranspose", "LazyConv", "LazyConvTranspose")
    for dims in (1, 2, 3)
) | frozenset(f"torch.nn.functional.conv{dims}d" for dims in (1, 2, 3))
_MODEL_FACTORIES = ("torch.nn.", "torchvision.models.", "timm.create_model")
# Statements whose body may not run.
_BRANCHES = (cst.If, cst.For, cst.While, cst.Try, cst.Match)
# Calls that return a device object (`torch.accelerator` is the device-generic API).
_DEVICE_CALLS = frozenset({"torch.device", "torch.accelerator.current_accelerator"})
_DEVICE_STRINGS = ("cuda", "cpu", "mps", "xpu")


class LoopRole(Enum):
    TRAIN = "train"
    EVAL = "eval"


@dataclass
class StepLoop:
    """A loop over batches: one iteration is one training or evaluation step."""

    node: cst.For | cst.While
    role: LoopRole
    loader: str | None  # name_key of the DataLoader it reads, when known
    batch_names: frozenset[str]  # names bound by the loop target


@dataclass
class KeywordDict:
    """What a `**kwargs` dict passed to a call is known to hold."""

    values: dict[str, list[cst.BaseExpression]] = field(
        default_factory=lambda: defaultdict(list)
    )
    opaque: bool = False  # built or changed in a way we cannot follow
    display: cst.Dict | None = None  # the `{...}` the name was first bound to
    # Keys only some paths set: added by an `.update()` or `d[k] = v` under a condition
    # (e.g. `if use_cuda:`) that does not also hold the display.
    sometimes: set[str] = field(default_factory=set)


class Missing(Enum):
    """A keyword argument that is certainly not passed."""

    MISSING = "missing"


class Unknown(Enum):
    """A keyword argument that may be passed, with a value we cannot see."""

    UNKNOWN = "unknown"


KeywordValue = cst.BaseExpression | Missing | Unknown


@dataclass
class ScriptModel:
    """Facts about one script, computed by `build_script_model`."""

    loaders: dict[str, list[cst.Call]] = field(default_factory=dict)
    loader_calls: list[cst.Call] = field(default_factory=list)
    models: set[str] = field(default_factory=set)
    optimizers: set[str] = field(default_factory=set)
    criteria: set[str] = field(default_factory=set)
    devices: set[str] = field(default_factory=set)
    step_loops: dict[cst.CSTNode, StepLoop] = field(default_factory=dict)
    epoch_loops: set[cst.CSTNode] = field(default_factory=set)  # loops around a training step loop
    keyword_dicts: dict[str, KeywordDict] = field(default_factory=dict)
    uses_cuda: bool = False
    has_convolutions: bool = False
    # `nn.DataParallel` models, aliases included (`self.model = model`).
    data_parallel: set[str] = field(default_factory=set)
    # Names whose `.parameters()` an optimizer receives, as written (no aliases): the
    # models that train, not their layers nor a wrapper around them.
    trained: set[str] = field(default_factory=set)
    # (target, source) of `a = b` (device moves stripped) and of arguments
    # passed to parameters of functions defined in the script.
    aliases: list[tuple[str, str]] = field(default_factory=list)
    # Parents, scopes and qualified names of the module (None for an empty model).
    index: ModuleIndex | None = field(default=None, repr=False, compare=False)

    def keyword(self, call: cst.Call, name: str) -> KeywordValue:
        """The value `call` passes for keyword `name`, following `**dict` arguments."""
        found: KeywordValue = Missing.MISSING
        for arg in call.args:
            if arg.keyword is not None and arg.keyword.value == name:
                found = arg.value
            elif arg.star == "**":
                key = name_key(arg.value)
                kwargs = self.keyword_dicts.get(key) if key else None
                if kwargs is None or kwargs.opaque:
                    return Unknown.UNKNOWN
                values = kwargs.values.get(name)
                if values:
                    found = values[0] if len(values) == 1 else Unknown.UNKNOWN
            elif arg.star == "*":
                return Unknown.UNKNOWN
        return found

    def sometimes_missing(self, call: cst.Call, name: str) -> cst.Dict | None:
        """The `{...}` display of a `**dict` argument of `call` that holds keyword
        `name` only on some paths (so `call` may run without it), if there is one."""
        for arg in call.args:
            key = name_key(arg.value) if arg.star == "**" else None
            kwargs = self.keyword_dicts.get(key) if key else None
            if kwargs is not None and not kwargs.opaque and name in kwargs.sometimes:
                return kwargs.display
        return None

    def is_loss_call(self, node: cst.CSTNode | None) -> bool:
        """`criterion(...)` of a loss module built in the script, or a call of a
        `torch.nn.functional` loss."""
        if not isinstance(node, cst.Call) or self.index is None:
            return False
        return name_key(node.func) in self.criteria or is_functional_loss(
            self.index.qualified_names(node.func)
        )


class _Collector(BindingVisitor, cst.CSTVisitor):
    """Gathers the facts in one walk (see `run_visitors`); `finish` closes them."""

    def __init__(self, index: ModuleIndex) -> None:
        super().__init__()
        self.index = index
        self.model = ScriptModel(index=index)
        self.aliases = self.model.aliases
        self.module_classes: set[str] = set()
        self.loop_stack: list[cst.For | cst.While] = []
        self.training_loops: set[cst.CSTNode] = set()  # bodies call `.backward()`
        self.parameters: dict[str, list[str]] = {}  # function name -> parameter names
        self.calls: list[tuple[str, cst.Call]] = []  # calls of functions defined here

    # -- names bound by assignments ------------------------------------------------
    def bind(self, target: cst.BaseExpression, value: cst.BaseExpression) -> None:
        key = name_key(target)
        if key is None:
            return
        if isinstance(value, cst.Dict):
            self._record_dict(key, value)
        elif isinstance(value, cst.Call) and is_name(value.func, "dict"):
            self._record_dict_call(key, value)
        self._alias(key, value)
        if self._is_device_value(value):
            self.model.devices.add(key)
        if any(
            DATA_PARALLEL in self.index.qualified_names(call.func)
            for call in _possible_calls(value)
        ):
            self.model.data_parallel.add(key)
        call = strip_device_moves(value)
        if not isinstance(call, cst.Call):
            return
        names = self.index.qualified_names(call.func)
        if DATALOADER in names:
            self.model.loaders.setdefault(key, []).append(call)
        elif any(n.startswith("torch.optim.") and n.count(".") == 2 for n in names):
            self.model.optimizers.add(key)
        elif any(n.startswith("torch.nn.") and n.endswith("Loss") for n in names):
            self.model.criteria.add(key)
        elif names & _DEVICE_CALLS:
            self.model.devices.add(key)
        elif _is_model_factory(names) or (
            isinstance(call.func, cst.Name) and call.func.value in self.module_classes
        ):
            self.model.models.add(key)

    def _is_device_value(self, value: cst.BaseExpression) -> bool:
        """`"cuda"`, `"cuda" if c else "cpu"`, `args.device or "cuda:0"`: a device
        written as a string (plain, or as one of the values the expression may take)."""
        if isinstance(value, cst.IfExp) and _mentions_cuda_string(value):
            return True
        return any(
            _is_device_string(leaf)
            or (isinstance(leaf, cst.Call) and self.index.qualified_names(leaf.func) & _DEVICE_CALLS)
            for leaf in device_leaves(value)
        )

    def _record_dict(self, key: str, value: cst.Dict) -> None:
        kwargs = self.model.keyword_dicts.setdefault(key, KeywordDict(display=value))
        for element in value.elements:
            if isinstance(element, cst.DictElement) and isinstance(
                element.key, cst.SimpleString
            ):
                kwargs.values[element.key.evaluated_value].append(element.value)  # type: ignore[index]
            elif isinstance(element, cst.StarredDictElement):
                self._merge_dict(kwargs, element.value)
            else:
                kwargs.opaque = True

    def _record_dict_call(self, key: str, value: cst.Call) -> None:
        kwargs = self.model.keyword_dicts.setdefault(key, KeywordDict())
        for arg in value.args:
            if arg.keyword is not None:
                kwargs.values[arg.keyword.value].append(arg.value)
            else:
                kwargs.opaque = True

    def _merge_dict(self, kwargs: KeywordDict, source: cst.BaseExpression) -> None:
        if isinstance(source, cst.Dict):
            for element in source.elements:
                if isinstance(element, cst.DictElement) and isinstance(
                    element.key, cst.SimpleString
                ):
                    kwargs.values[element.key.evaluated_value].append(element.value)  # type: ignore[index]
                else:
                    kwargs.opaque = True
            return
        key = name_key(source)
        other = self.model.keyword_dicts.get(key) if key else None
        if other is None or other.opaque:
            kwargs.opaque = True
            return
        for name, values in other.values.items():
            kwargs.values[name].extend(values)

    def visit_Subscript(self, node: cst.Subscript) -> None:
        # `kwargs["num_workers"] = 4` as an assignment target
        parent = self.index.parent(node)
        if not isinstance(parent, cst.AssignTarget):
            return
        key = name_key(node.value)
        if key is None or key not in self.model.keyword_dicts:
            return
        kwargs = self.model.keyword_dicts[key]
        index = node.slice[0].slice if len(node.slice) == 1 else None
        assign = self.index.parent(parent)
        if (
            isinstance(index, cst.Index)
            and isinstance(index.value, cst.SimpleString)
            and isinstance(assign, cst.Assign)
        ):
            known = {name for name, values in kwargs.values.items() if values}
            kwargs.values[index.value.evaluated_value].append(assign.value)  # type: ignore[index]
            self._note_conditional_keys(kwargs, known, node)
        else:
            kwargs.opaque = True

    def _note_conditional_keys(self, kwargs: KeywordDict, known: set[str], change: cst.CSTNode) -> None:
        """Keys that `change` added to `kwargs` under a condition the display is not under."""
        if kwargs.display is None:
            return
        around_display = set(self.index.ancestors(kwargs.display))
        if any(
            isinstance(ancestor, _BRANCHES) and ancestor not in around_display
            for ancestor in self.index.ancestors(change)
        ):
            added = {name for name, values in kwargs.values.items() if values} - known
            kwargs.sometimes |= added

    def visit_Call(self, node: cst.Call) -> None:
        func = node.func
        names = self.index.qualified_names(func)
        if DATALOADER in names:
            self.model.loader_calls.append(node)
        self._record_local_call(node)
        if names & CONVOLUTIONS:
            self.model.has_convolutions = True
        if any(n.startswith(("torch.cuda.", "torch.accelerator.")) for n in names):
            self.model.uses_cuda = True
        if not isinstance(func, cst.Attribute):
            return
        method = func.attr.value
        if method == "backward":
            self._mark_training_loops(node)
        elif method == "cuda":
            self.model.uses_cuda = True
        elif method == "update":
            key = name_key(func.value)
            if key in self.model.keyword_dicts:
                kwargs = self.model.keyword_dicts[key]  # type: ignore[index]
                known = {name for name, values in kwargs.values.items() if values}
                for arg in node.args:
                    if arg.keyword is not None:
                        kwargs.values[arg.keyword.value].append(arg.value)
                    else:
                        self._merge_dict(kwargs, arg.value)
                self._note_conditional_keys(kwargs, known, node)
        elif method == "parameters":
            if self._is_optimizer_argument(node):
                key = name_key(func.value)
                if key is not None:
                    self.model.models.add(key)
                    self.model.trained.add(key)

    def _mark_training_loops(self, backward: cst.Call) -> None:
        """Every loop whose body holds this `.backward()` call trains."""
        child: cst.CSTNode = backward
        for ancestor in self.index.ancestors(backward):
            if isinstance(ancestor, (cst.For, cst.While)) and child is ancestor.body:
                self.training_loops.add(ancestor)
            child = ancestor

    def _is_optimizer_argument(self, node: cst.Call) -> bool:
        parent = self.index.parent(node)
        while isinstance(parent, (cst.Arg, cst.Element, cst.List, cst.Tuple, cst.DictElement, cst.Dict)):
            parent = self.index.parent(parent)
        if not isinstance(parent, cst.Call):
            return False
        names = self.index.qualified_names(parent.func)
        return any(n.startswith("torch.optim.") for n in names)

    def visit_SimpleString(self, node: cst.SimpleString) -> None:
        value = node.evaluated_value
        if isinstance(value, str) and (value == "cuda" or value.startswith("cuda:")):
            self.model.uses_cuda = True

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        for base in node.bases:
            if "torch.nn.Module" in self.index.qualified_names(base.value):
                self.module_classes.add(node.name.value)

    # -- loops ---------------------------------------------------------------------
    def visit_For(self, node: cst.For) -> None:
        self.loop_stack.append(node)

    def leave_For(self, original_node: cst.For) -> None:
        self.loop_stack.pop()
        self._classify_loop(original_node, _loaded_object(original_node.iter))

    def visit_While(self, node: cst.While) -> None:
        self.loop_stack.append(node)

    def leave_While(self, original_node: cst.While) -> None:
        self.loop_stack.pop()
        self._classify_loop(original_node, None)

    def _classify_loop(self, node: cst.For | cst.While, source: str | None) -> None:
        if node in self.model.epoch_loops:
            return
        trains = node in self.training_loops
        if not trains and source is None:
            return
        if trains:
            self.model.epoch_loops.update(self.loop_stack)
        batch_names = (
            frozenset(bound_names(node.target)) if isinstance(node, cst.For) else frozenset()
        )
        self.model.step_loops[node] = StepLoop(
            node=node,
            role=LoopRole.TRAIN if trains else LoopRole.EVAL,
            loader=source,
            batch_names=batch_names,
        )

    # -- functions: arguments passed at call sites alias their parameters ----------
    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        params = [p.name.value for p in node.params.params]
        if params and params[0] == "self":
            params = params[1:]
        self.parameters[node.name.value] = params + [
            p.name.value for p in node.params.kwonly_params
        ]

    def _record_local_call(self, node: cst.Call) -> None:
        key = name_key(node.func)
        if key is not None:
            self.calls.append((key.removeprefix("self."), node))

    def _alias_arguments(self) -> None:
        for function, call in self.calls:
            params = self.parameters.get(function)
            if params is None:
                continue
            positional = [a for a in call.args if a.keyword is None and not a.star]
            for param, arg in zip(params, positional):
                self._alias(param, arg.value)
            for arg in call.args:
                if arg.keyword is not None:
                    self._alias(arg.keyword.value, arg.value)

    def _alias(self, target: str, value: cst.BaseExpression) -> None:
        source = name_key(strip_device_moves(value))
        if source is not None and source != target:
            self.aliases.append((target, source))

    def finish(self) -> ScriptModel:
        """Resolve aliases (`self.loader = loader`, arguments) and drop loops over non-loaders."""
        self._alias_arguments()
        changed = True
        while changed:
            changed = False
            for target, source in self.aliases:
                for group in (
                    self.model.models,
                    self.model.optimizers,
                    self.model.criteria,
                    self.model.devices,
                ):
                    if source in group and target not in group:
                        group.add(target)
                        changed = True
                if source in self.model.data_parallel and target not in self.model.data_parallel:
                    self.model.data_parallel.add(target)
                    changed = True
                if source in self.model.loaders and target not in self.model.loaders:
                    self.model.loaders[target] = self.model.loaders[source]
                    changed = True
        for loop in list(self.model.step_loops.values()):
            if loop.role is LoopRole.EVAL and loop.loader not in self.model.loaders:
                del self.model.step_loops[loop.node]
        return self.model


def strip_device_moves(value: cst.BaseExpression) -> cst.BaseExpression:
    """`Net().to(device)` / `Net().cuda()` -> `Net()`."""
    while (
        isinstance(value, cst.Call)
        and isinstance(value.func, cst.Attribute)
        and value.func.attr.value in ("to", "cuda")
    ):
        value = value.func.value
    return value


def _possible_calls(value: cst.BaseExpression) -> list[cst.Call]:
    """The calls an assigned value may be: both branches of `a if c else b`."""
    if isinstance(value, cst.IfExp):
        return _possible_calls(value.body) + _possible_calls(value.orelse)
    value = strip_device_moves(value)
    return [value] if isinstance(value, cst.Call) else []


def _is_model_factory(names: frozenset[str]) -> bool:
    """`nn.Linear(...)`, `torchvision.models.resnet50()`: not `torch.nn.functional.relu`."""
    return any(
        n.startswith(_MODEL_FACTORIES) and not n.startswith("torch.nn.functional.") for n in names
    )


def device_leaves(value: cst.BaseExpression) -> list[cst.BaseExpression]:
    """The values `a or b` / `a if c else b` may take."""
    if isinstance(value, cst.BooleanOperation):
        return [*device_leaves(value.left), *device_leaves(value.right)]
    if isinstance(value, cst.IfExp):
        return [*device_leaves(value.body), *device_leaves(value.orelse)]
    return [value]


def _is_device_string(value: cst.BaseExpression) -> bool:
    """`"cuda"`, `"cuda:0"`, `"cpu"`, `"mps"`."""
    if not isinstance(value, cst.SimpleString):
        return False
    text = value.evaluated_value
    return isinstance(text, str) and text.split(":")[0] in _DEVICE_STRINGS


def _mentions_cuda_string(node: cst.CSTNode) -> bool:
    return any(
        isinstance(n, cst.SimpleString) and "cuda" in n.value for n in descendants(node)
    )


def _loaded_object(iterable: cst.BaseExpression) -> str | None:
    """The loader a `for` reads: `loader`, `enumerate(loader)`, `tqdm(loader, ...)`."""
    while isinstance(iterable, cst.Call) and iterable.args:
        iterable = iterable.args[0].value
    return name_key(iterable)


def build_script_model(wrapper: MetadataWrapper, index: ModuleIndex | None = None) -> ScriptModel:
    """Analyse the module held by `wrapper` (pass the module's `index` when built already)."""
    module = wrapper.module
    collector = _Collector(index or ModuleIndex(module))
    run_visitors(module, [collector])
    return collector.finish()
