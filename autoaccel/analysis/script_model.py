"""The script model: what one module of a training program is made of.

Rules and convert transforms share it instead of each re-discovering which names are
DataLoaders, models, optimizers, criteria and devices, and which loops train or
evaluate. It is a view of one module onto the whole-program analysis
(`autoaccel.analysis.program`, `autoaccel.analysis.training`): objects are followed
through calls, returns, `self.x` and local modules; loops are classified by what they
reach. Two kinds of questions are answered:

- by node (`values`, `streams`, `runs_training`): exact, scope-aware;
- by spelling (`models`, `loaders`, ...: sets of `name_key`s such as `model`,
  `self.loader`), for code that matches names as written in this module.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection, Iterator
from dataclasses import dataclass, field
from enum import Enum

import libcst as cst
from libcst.metadata import MetadataWrapper

from autoaccel.analysis.datasets import indexes_only
from autoaccel.analysis.devices import device_types
from autoaccel.analysis.every_step import StepRuns, Steps
from autoaccel.analysis.index import ModuleIndex, Scope, descendants, run_visitors
from autoaccel.analysis.losses import is_functional_loss
from autoaccel.analysis.names import name_key
from autoaccel.analysis.program import (
    DATA_PARALLEL,
    DATALOADER,
    DISTRIBUTED_DATA_PARALLEL,
    ClassInfo,
    FunctionInfo,
    Kind,
    Obj,
    Program,
    ProgramCollector,
    SourceModule,
    Values,
    argument,
    is_device_string,
)
from autoaccel.analysis.shapes import BindingVisitor, is_name
from autoaccel.analysis.training import LoopRole, StepLoop, Training, find_training, trains

__all__ = [
    "CONVOLUTIONS", "DATALOADER", "DATA_PARALLEL", "DISTRIBUTED_DATA_PARALLEL",
    "DISTRIBUTED_SAMPLER", "KeywordDict", "KeywordValue", "LoopRole", "Missing",
    "ProjectContext", "ScriptModel", "StepLoop", "Unknown", "build_script_model", "device_leaves",
    "is_device_string", "strip_device_moves",
]  # fmt: skip

DISTRIBUTED_SAMPLER = "torch.utils.data.DistributedSampler"
ITERABLE_DATASETS = ("torch.utils.data.IterableDataset", "torch.utils.data.dataset.IterableDataset")
CONVOLUTIONS = frozenset(
    f"torch.nn.{kind}{dims}d"
    for kind in ("Conv", "ConvTranspose", "LazyConv", "LazyConvTranspose")
    for dims in (1, 2, 3)
) | frozenset(f"torch.nn.functional.conv{dims}d" for dims in (1, 2, 3))
# Statements whose body may not run.
_BRANCHES = (cst.If, cst.For, cst.While, cst.Try, cst.Match)


@dataclass
class KeywordDict:
    """What a `**kwargs` dict passed to a call is known to hold."""

    values: dict[str, list[cst.BaseExpression]] = field(default_factory=lambda: defaultdict(list))
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
    """Facts about one module of a program, computed by `build_script_model`."""

    # -- by spelling (name_keys of this module) ------------------------------------
    loaders: dict[str, list[cst.Call]] = field(default_factory=dict)
    loader_calls: list[cst.Call] = field(default_factory=list)  # DataLoader calls written here
    models: set[str] = field(default_factory=set)
    optimizers: set[str] = field(default_factory=set)
    criteria: set[str] = field(default_factory=set)
    devices: set[str] = field(default_factory=set)
    # `nn.DataParallel` models, aliases included (`self.model = model`).
    data_parallel: set[str] = field(default_factory=set)
    # Names whose `.parameters()` an optimizer receives, as written (no aliases): the
    # models that train, not their layers nor a wrapper around them.
    trained: set[str] = field(default_factory=set)
    keyword_dicts: dict[str, KeywordDict] = field(default_factory=dict)
    # id of another module of the program -> its `keyword_dicts`
    other_keyword_dicts: dict[int, dict[str, KeywordDict]] = field(default_factory=dict, repr=False)
    # -- loops of this module --------------------------------------------------------
    step_loops: dict[cst.CSTNode, StepLoop] = field(default_factory=dict)
    epoch_loops: set[cst.CSTNode] = field(default_factory=set)  # loops around a step loop
    micro_loops: set[cst.CSTNode] = field(default_factory=set)  # loops inside a step loop
    uses_cuda: bool = False  # this module, or with a project any module of the program
    has_convolutions: bool = False
    # -- the whole program -----------------------------------------------------------
    index: ModuleIndex | None = field(default=None, repr=False, compare=False)
    program: Program | None = field(default=None, repr=False, compare=False)
    module: SourceModule | None = field(default=None, repr=False, compare=False)
    training: Training = field(default_factory=Training, repr=False, compare=False)
    _step_runs: StepRuns | None = field(default=None, repr=False, compare=False)

    # -- by node ---------------------------------------------------------------------
    def values(self, node: cst.BaseExpression) -> Values:
        """What `node`, an expression of this module, may hold."""
        if self.program is None or self.module is None:
            return frozenset()
        return self.program.values_of(node, self.module)

    def flat_values(self, node: cst.BaseExpression) -> Values:
        """`values`, with containers replaced by what they hold (`set_model()` returning
        `model, criterion` holds both)."""
        if self.program is None or self.module is None:
            return frozenset()
        return self.program.flat_values_of(node, self.module)

    def device_types(self, node: cst.BaseExpression) -> frozenset[str]:
        """The device types (`cuda`, `cpu`, `devices.ACCELERATOR`, ...) the expression
        `node` of this module may name, wherever in the program its device was made;
        empty when no device object reaches it or the code does not say which."""
        if self.program is None:
            return frozenset()
        found: set[str] = set()
        for obj in self.values(node):
            found |= device_types(obj, self.program)
        return frozenset(found)

    def trains(self, obj: Obj) -> bool:
        """Whether an optimizer updates the parameters of `obj`."""
        return trains(self.training, obj)

    def names_of(self, objects: Collection[Obj]) -> set[str]:
        """The names of this module (`model`, `self.net`) that may hold one of `objects`,
        wherever in the program those were made."""
        if self.program is None or self.module is None:
            return set()
        return {key for _, key, values in _spelled_values(self) if not values.isdisjoint(objects)}

    def held_by(self, key: str) -> set[Obj]:
        """What the name `key` of this module (`model`, `self.net`) may hold, in any of
        its scopes."""
        if self.program is None or self.module is None:
            return set()
        return {obj for _, name, values in _spelled_values(self) if name == key for obj in values}

    def holders(self, objects: Collection[Obj]) -> list[tuple[cst.CSTNode, str]]:
        """The names of this module that may hold one of `objects`, each with the code it
        is a name in: its function (`net` of `def save(net)` called as `save(model)`),
        class (`self.net`) or the module."""
        if self.program is None or self.module is None:
            return []
        return [
            (_code_of(self, owner), key)
            for owner, key, values in _spelled_values(self)
            if not values.isdisjoint(objects)
        ]

    def runs_training(self, node: cst.CSTNode) -> bool:
        """Whether `node` (a statement of this module) holds a training step loop or calls
        a function that runs one, directly or through other calls."""
        if self.program is None:
            return False
        for child in descendants(node):
            if (
                child in self.training.step_loops
                and self.training.step_loops[child].role is LoopRole.TRAIN
            ):
                return True
            if (
                isinstance(child, cst.Call)
                and self.program.callees.get(child, set()) & self.training.trainers
            ):
                return True
        return False

    def every_step(self, node: cst.CSTNode, index: ModuleIndex | None = None) -> Steps:
        """The role of a step loop that runs `node` on every iteration (in its body, or in
        a function one of its calls runs), None when none does; and whether `node` runs
        only there (every call of its function is per step). `index`: that of the module
        `node` belongs to, when it is not this one. See `autoaccel.analysis.every_step`."""
        runs = self.step_runs
        if runs is None:
            return (None, False)
        return runs.steps(node, index or self.index)  # type: ignore[arg-type]

    @property
    def step_runs(self) -> StepRuns | None:
        if self._step_runs is None and self.program is not None:
            self._step_runs = StepRuns(self.program, self.training)
        return self._step_runs

    def backpropagates(self, node: cst.CSTNode) -> bool:
        """Whether `node` calls `.backward()`, or a function of the project that does,
        directly or through others (`loss = self.training_step(x, y)`)."""
        return any(
            isinstance(child, cst.Call)
            and (child in self.training.backward_calls or self.runs_backward(child))
            for child in descendants(node)
        )

    def runs_backward(self, call: cst.Call) -> bool:
        """Whether `call` runs a function of the project that calls `.backward()`,
        directly or through others, or is a library call that runs it for the step
        (`loss_scaler(loss, optimizer)`)."""
        return self.program is not None and (
            call in self.training.library_steps
            or bool(self.program.callees.get(call, set()) & self.training.backpropagating)
        )

    def callees(self, call: cst.Call) -> set[FunctionInfo]:
        """The functions of the project `call` (of this module) may run."""
        return set(self.program.callees.get(call, ())) if self.program is not None else set()

    def returns_loss(self, call: cst.Call) -> bool:
        """Whether `call` (of this module) runs functions of the project that each return
        the tensor they call `.backward()` on (`loss = self.training_step(x, y)`): a
        tensor with a graph, on the device the step runs on."""
        if self.program is None:
            return False
        functions = self.program.callees.get(call)
        return bool(functions) and all(
            _returns_backpropagated(f, self.program, self.training) for f in functions
        )

    @property
    def builds_ddp(self) -> bool:
        """Whether a module of the program wraps a model in `DistributedDataParallel`
        (`main.py` builds it, `engine.py` trains it)."""
        return self.program is not None and any(
            obj.parallel == "ddp" for obj in self.program.objects(Kind.MODULE)
        )

    def model_method(self, call: cst.Call) -> bool:
        """Whether `call` (of this module) runs a method that the class of a model
        defines (`agent.get_action_and_value(obs)`, not `forward` nor an `nn.Module`
        method): computed by the model's layers, its tensors are where the model is."""
        func = call.func
        if not isinstance(func, cst.Attribute) or self.program is None:
            return False
        name = func.attr.value
        models = [o for o in self.values(func.value) if o.kind is Kind.MODULE]
        return bool(models) and all(
            obj.cls is not None and obj.cls.method(name) is not None and name != "forward"
            for obj in models
        )

    def streams(self, loader: cst.Call) -> bool:
        """Whether the DataLoader call `loader` reads an `IterableDataset` of the project:
        every worker (and every process) would replay the whole stream."""
        dataset = argument(loader, 0, "dataset")
        return dataset is not None and any(
            obj.cls is not None and obj.cls.derives_from(*ITERABLE_DATASETS)
            for obj in self.values(dataset)
        )

    def in_memory(self, loader: cst.Call) -> bool:
        """Whether the DataLoader call `loader` reads samples that are rows of data held
        in memory: a `TensorDataset`, or a Dataset of the project whose `__getitem__`
        only indexes its attributes. Worker processes would only add their overhead."""
        dataset = argument(loader, 0, "dataset")
        datasets = self.values(dataset) if dataset is not None else frozenset()
        return bool(datasets) and all(_indexed_rows(obj) for obj in datasets)

    # -- keyword arguments -------------------------------------------------------------
    def keyword(self, call: cst.Call, name: str) -> KeywordValue:
        """The value `call` passes for keyword `name`, following `**dict` arguments (the
        dicts of the module `call` is written in: a loader built in `data.py`)."""
        found: KeywordValue = Missing.MISSING
        dicts = self._keyword_dicts_of(call)
        for arg in call.args:
            if arg.keyword is not None and arg.keyword.value == name:
                found = arg.value
            elif arg.star == "**":
                key = name_key(arg.value)
                kwargs = dicts.get(key) if key else None
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
        dicts = self._keyword_dicts_of(call)
        for arg in call.args:
            key = name_key(arg.value) if arg.star == "**" else None
            kwargs = dicts.get(key) if key else None
            if kwargs is not None and not kwargs.opaque and name in kwargs.sometimes:
                return kwargs.display
        return None

    def _keyword_dicts_of(self, call: cst.Call) -> dict[str, KeywordDict]:
        """The `**kwargs` dicts of the module `call` is written in."""
        module = self.program.module_of.get(call) if self.program is not None else None
        if module is None or module is self.module:
            return self.keyword_dicts
        return self.other_keyword_dicts.get(id(module), {})

    def is_loss_call(self, node: cst.CSTNode | None) -> bool:
        """`criterion(...)` of a loss module, or a call of a `torch.nn.functional` loss."""
        if not isinstance(node, cst.Call) or self.index is None:
            return False
        if any(obj in self.training.criteria for obj in self.values(node.func)):
            return True
        return name_key(node.func) in self.criteria or is_functional_loss(
            self.index.qualified_names(node.func)
        )


def _keys(display: cst.Dict) -> set[str]:
    """The string keys a `{...}` display writes out."""
    return {
        element.key.evaluated_value  # type: ignore[misc]
        for element in display.elements
        if isinstance(element, cst.DictElement) and isinstance(element.key, cst.SimpleString)
    }


class _Syntax(BindingVisitor, cst.CSTVisitor):
    """What this module says in so many words: `**kwargs` dicts, CUDA, convolutions."""

    def __init__(self, index: ModuleIndex, model: ScriptModel) -> None:
        super().__init__()
        self.index = index
        self.model = model

    def bind(self, target: cst.BaseExpression, value: cst.BaseExpression) -> None:
        key = name_key(target)
        if key is None:
            return
        if isinstance(value, cst.Dict):
            self._record_dict(key, value)
        elif (
            isinstance(value, cst.IfExp)
            and isinstance(value.body, cst.Dict)
            and isinstance(value.orelse, cst.Dict)
        ):
            # `{"pin_memory": True} if use_cuda else {}`: a key of one branch only is set
            # on some paths
            for branch in (value.body, value.orelse):
                self._record_dict(key, branch)
            kwargs = self.model.keyword_dicts[key]
            kwargs.sometimes |= _keys(value.body) ^ _keys(value.orelse)
        elif isinstance(value, cst.Call) and is_name(value.func, "dict"):
            kwargs = self.model.keyword_dicts.setdefault(key, KeywordDict())
            for arg in value.args:
                if arg.keyword is not None:
                    kwargs.values[arg.keyword.value].append(arg.value)
                else:
                    kwargs.opaque = True

    def _record_dict(self, key: str, value: cst.Dict) -> None:
        kwargs = self.model.keyword_dicts.setdefault(key, KeywordDict(display=value))
        for element in value.elements:
            if isinstance(element, cst.StarredDictElement):
                self._merge_dict(kwargs, element.value)
            else:
                self._merge_element(kwargs, element)

    def _merge_element(self, kwargs: KeywordDict, element: cst.BaseDictElement) -> None:
        if isinstance(element, cst.DictElement) and isinstance(element.key, cst.SimpleString):
            kwargs.values[element.key.evaluated_value].append(element.value)  # type: ignore[index]
        else:
            kwargs.opaque = True

    def _merge_dict(self, kwargs: KeywordDict, source: cst.BaseExpression) -> None:
        if isinstance(source, cst.Dict):
            for element in source.elements:
                self._merge_element(kwargs, element)
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

    def _note_conditional_keys(
        self, kwargs: KeywordDict, known: set[str], change: cst.CSTNode
    ) -> None:
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
        names = self.index.qualified_names(node.func)
        if DATALOADER in names:
            self.model.loader_calls.append(node)
        if names & CONVOLUTIONS:
            self.model.has_convolutions = True
        if any(n.startswith(("torch.cuda.", "torch.accelerator.")) for n in names):
            self.model.uses_cuda = True
        func = node.func
        if not isinstance(func, cst.Attribute):
            return
        if func.attr.value == "cuda":
            self.model.uses_cuda = True
        elif func.attr.value == "update":
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

    def visit_SimpleString(self, node: cst.SimpleString) -> None:
        value = node.evaluated_value
        if not isinstance(value, str) or not (value == "cuda" or value.startswith("cuda:")):
            return
        parent = self.index.parent(node)
        if isinstance(parent, cst.DictElement) and parent.key is node:
            return  # `map_location={"cuda:0": ...}` maps where a checkpoint was saved
        self.model.uses_cuda = True


def _returns_backpropagated(function: FunctionInfo, program: Program, training: Training) -> bool:
    """Whether every `return` of `function` (not of a function nested in it) returns a
    name that `function` calls `.backward()` on."""
    backpropagated = {
        name_key(call.func.value)  # type: ignore[attr-defined]
        for call in training.backward_calls
        if program.function_of.get(call) is function
    } - {None}
    index = function.module.index
    returns = [
        node
        for node in descendants(function.node.body)
        if isinstance(node, cst.Return)
        and next(a for a in index.ancestors(node) if isinstance(a, (cst.FunctionDef, cst.Lambda)))
        is function.node
    ]
    return bool(returns) and all(
        r.value is not None and name_key(r.value) in backpropagated for r in returns
    )


def _indexed_rows(dataset: Obj) -> bool:
    if dataset.kind is Kind.TENSOR_DATASET:
        return True
    getitem = dataset.cls.method("__getitem__") if dataset.cls is not None else None
    return getitem is not None and indexes_only(getitem.node, getitem.module.index)


def _fill(model: ScriptModel) -> ScriptModel:
    """The facts of `model.module` that come from the program: spellings and loops."""
    program, module, training = model.program, model.module, model.training
    assert program is not None and module is not None
    for _, key, objects in _spelled_values(model):
        for obj in objects:
            _file(model, key, obj)
    for node, loop in training.step_loops.items():
        if loop.module is module:
            model.step_loops[node] = loop
    model.epoch_loops = {n for n in training.epoch_loops if program.module_of[n] is module}
    model.micro_loops = {n for n in training.micro_loops if program.module_of[n] is module}
    for optimizer in program.objects(Kind.OPTIMIZER):
        params = argument(optimizer.node, 0, "params")  # type: ignore[arg-type]
        for obj in program.flat_values_of(params, optimizer.module) if params is not None else ():
            if obj.kind is Kind.PARAMETERS and obj.module is module:
                key = name_key(obj.node.func.value)  # type: ignore[attr-defined]
                if key is not None:
                    model.trained.add(key)
    return model


def _spelled_values(model: ScriptModel) -> Iterator[tuple[Scope | ClassInfo, str, set[Obj]]]:
    """The names of `model.module` (`model`, `self.net`: name keys) with their scope or
    class and what each may hold."""
    program, module = model.program, model.module
    assert program is not None and module is not None
    own = module.scope
    for (owner, name), objects in program.values.items():
        if isinstance(owner, Scope) and owner.module is own:
            if name != "self":  # the instance inside its own methods: not a name for the object
                yield owner, name, objects
        elif isinstance(owner, ClassInfo) and owner.module is module:
            yield owner, f"self.{name}", objects


def _code_of(model: ScriptModel, owner: Scope | ClassInfo) -> cst.CSTNode:
    """The class or function whose names `owner` holds; the module for the others."""
    assert model.program is not None and model.module is not None
    if isinstance(owner, ClassInfo):
        return owner.node
    function = model.program.function_of_scope(owner)
    return function.node if function is not None else model.module.tree


def _file(model: ScriptModel, key: str, obj: Obj) -> None:
    kind = obj.kind
    if kind is Kind.LOADER:
        calls = model.loaders.setdefault(key, [])
        if obj.node not in calls:
            calls.append(obj.node)  # type: ignore[arg-type]
    elif kind is Kind.OPTIMIZER:
        model.optimizers.add(key)
    elif kind is Kind.DEVICE:
        model.devices.add(key)
    elif obj in model.training.criteria or kind is Kind.CRITERION:
        model.criteria.add(key)
    elif kind is Kind.MODULE or (kind is Kind.EXTERNAL and model.trains(obj)):
        model.models.add(key)
        if obj.parallel == "dp":
            model.data_parallel.add(key)


@dataclass(frozen=True)
class ProjectContext:
    """Where a module sits in its project: its import name and package, and the other
    modules of the program (parsed, as they are now)."""

    name: str
    package: str = ""
    path: str | None = None
    others: tuple[SourceModule, ...] = ()


def build_script_model(
    wrapper: MetadataWrapper,
    index: ModuleIndex | None = None,
    project: ProjectContext | None = None,
) -> ScriptModel:
    """Analyse the module held by `wrapper` (pass the module's `index` when built
    already): on its own, or with the other modules of its `project`, so that objects,
    calls and training loops are followed across files. One walk of this module collects
    both the syntax and the program's constraints."""
    tree = wrapper.module
    index = index or ModuleIndex(tree)
    project = project or ProjectContext("__main__")
    module = SourceModule(project.name, tree, index, project.path, project.package)
    program = Program([module, *project.others])
    model = ScriptModel(index=index, program=program, module=module)
    run_visitors(tree, [_Syntax(index, model), ProgramCollector(program, module)])
    for other in project.others:
        syntax = _Syntax(other.index, ScriptModel())
        run_visitors(other.tree, [syntax, ProgramCollector(program, other)])
        model.uses_cuda = model.uses_cuda or syntax.model.uses_cuda
        model.other_keyword_dicts[id(other)] = syntax.model.keyword_dicts
    program.solve()
    model.training = find_training(program)
    return _fill(model)


def strip_device_moves(value: cst.BaseExpression) -> cst.BaseExpression:
    """`Net().to(device)` / `Net().cuda()` -> `Net()`."""
    while (
        isinstance(value, cst.Call)
        and isinstance(value.func, cst.Attribute)
        and value.func.attr.value in ("to", "cuda")
    ):
        value = value.func.value
    return value


def device_leaves(value: cst.BaseExpression) -> list[cst.BaseExpression]:
    """The values `a or b` / `a if c else b` may take."""
    if isinstance(value, cst.BooleanOperation):
        return [*device_leaves(value.left), *device_leaves(value.right)]
    if isinstance(value, cst.IfExp):
        return [*device_leaves(value.body), *device_leaves(value.orelse)]
    return [value]
