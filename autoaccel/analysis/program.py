"""What the names of a program hold: one flow-insensitive value analysis over its modules.

Every expression of interest evaluates to a set of abstract objects (`Obj`): a DataLoader,
an optimizer, a loss module, an `nn.Module`, a device, an instance of a class of the
project, a function or class of the project, a container of other objects. Objects are
made at their allocation site (the call that builds them), so two `DataLoader(...)` calls
are two objects. Variables are keyed by scope, not by spelling: `(scope, name)` for plain
names (a function's `loader` is not the module's), `(class family, attr)` for `self.attr`
and for attributes of instances of that class, `(function, "return")` for what a function
returns.

Module-level names are read in order: a binding made by a top-level statement is a
version of the name of its own, and a read sees the versions that can reach it (the
last unconditional one before it and any conditional ones since). Module-level code
reads at its statement; a function reads at the statements it is called from
(`(function, CALLED_AT)`, found with the calls), or after the whole module when no code
of the program calls it. A script of many `main`s that each train then costs what they
cost apart, and a name rebound at top level (`model = DataParallel(model)`) holds what
each statement left in it. Bindings made by functions (`global x`) reach every read.

Values flow through assignments (tuple unpacking included), arguments bound per call site
to the parameters of functions, methods and constructors of the project, `return`,
`for` targets and comprehensions, `self.x` across the methods of a class, calls of an
instance of a project class (its `__call__`), and wrappers (`tqdm(loader)`, `enumerate`,
`zip`, `iter`, `.to(device)`, `torch.compile`, and a generator of the project that
yields the items of what it loops over: `metric_logger.log_every(loader)`). The solver
re-runs only the constraints whose inputs grew (a worklist), so the cost stays close to
one pass over the assignments and calls of the program.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from enum import Enum
from typing import NamedTuple

import libcst as cst

from autoaccel.analysis.index import ModuleIndex, Scope, from_module, run_visitors
from autoaccel.analysis.losses import is_loss_module
from autoaccel.analysis.names import name_key
from autoaccel.analysis.shapes import bound_name_nodes, find, is_name

DATALOADER = "torch.utils.data.DataLoader"
TENSOR_DATASET = "torch.utils.data.TensorDataset"
# `torch.nn.parallel.DataParallel` and its module-internal path canonicalise to this.
DATA_PARALLEL = "torch.nn.DataParallel"
DISTRIBUTED_DATA_PARALLEL = "torch.nn.parallel.DistributedDataParallel"
_WRAPPERS = frozenset({DATA_PARALLEL, DISTRIBUTED_DATA_PARALLEL})
_DEVICE_CALLS = frozenset({"torch.device", "torch.accelerator.current_accelerator"})
_DEVICE_STRINGS = frozenset({"cuda", "cpu", "mps", "xpu"})
_MODULE_BASES = ("torch.nn.", "lightning.", "pytorch_lightning.")
# Calls whose result holds (or iterates over) what their positional arguments hold.
_PASS_THROUGH = frozenset(
    {
        "builtins.enumerate", "builtins.iter", "builtins.zip", "builtins.reversed",
        "builtins.list", "builtins.tuple", "builtins.sorted", "builtins.filter",
        "torch.compile", "torch.nn.SyncBatchNorm.convert_sync_batchnorm", "copy.deepcopy",
    }
)  # fmt: skip
_PASS_THROUGH_MODULES = ("itertools.", "tqdm.", "rich.progress.")
# Methods of an `nn.Module` that return the module itself.
_SELF_RETURNING = frozenset(
    {
        "to", "cuda", "cpu", "float", "half", "double", "bfloat16", "train", "eval",
        "requires_grad_", "apply", "share_memory", "to_empty", "type", "xpu", "mps",
    }
)  # fmt: skip
PARAMETER_METHODS = frozenset({"parameters", "named_parameters"})
# Legacy tensor types, with the device type of their tensors: `x.type(torch.cuda.FloatTensor)`
# copies `x` to the GPU, as `x.cuda()` does.
_ELEMENTS = ("Float", "Double", "Half", "BFloat16", "Byte", "Char", "Short", "Int", "Long", "Bool")
TENSOR_TYPES = {f"torch.{e}Tensor": "cpu" for e in _ELEMENTS} | {
    f"torch.cuda.{e}Tensor": "cuda" for e in _ELEMENTS
}


class Kind(Enum):
    LOADER = "DataLoader"
    OPTIMIZER = "optimizer"
    CRITERION = "loss module"
    MODULE = "nn.Module"
    DEVICE = "device"
    INSTANCE = "instance"  # of a class of the project that is not an nn.Module
    EXTERNAL = "external"  # made by an imported callable the analysis cannot read
    FUNCTION = "function"
    CLASS = "class"
    SOURCE_MODULE = "module"  # a module of the project, as imported
    PARAMETERS = "parameters"  # `model.parameters()`: `(obj, "of")` holds the model
    CONTAINER = "container"  # tuple/list/dict display: `(obj, i)`, `(obj, "*")`
    TENSOR_DATASET = "TensorDataset"  # samples are rows of tensors held in memory
    TENSOR_TYPE = "tensor type"  # `torch.cuda.FloatTensor`: a dtype and a device (TENSOR_TYPES)


@dataclass(eq=False)
class SourceModule:
    """One parsed module of the project."""

    name: str  # dotted, as imported (`trainer`, `mingpt.model`); the script is `__main__`
    tree: cst.Module
    index: ModuleIndex
    path: str | None = None
    package: str = ""  # the package its relative imports start from

    @property
    def scope(self) -> Scope:
        return self.index.scopes[self.tree]


@dataclass(eq=False)
class FunctionInfo:
    """A function or method defined in the project."""

    node: cst.FunctionDef
    module: SourceModule
    scope: Scope  # the function's own namespace
    cls: ClassInfo | None  # the class whose body defines it (a method)

    @property
    def name(self) -> str:
        return self.node.name.value

    @property
    def positional(self) -> list[str]:
        """Positional parameter names, `self` of a method included."""
        params = self.node.params
        return [p.name.value for p in (*params.posonly_params, *params.params)]

    @property
    def is_method(self) -> bool:
        """A method bound to its instance (not a static method)."""
        return self.cls is not None and not self._decorated("staticmethod")

    @property
    def is_classmethod(self) -> bool:
        """A method bound to its class."""
        return self.cls is not None and self._decorated("classmethod")

    def _decorated(self, builtin: str) -> bool:
        return any(
            isinstance(d.decorator, cst.Name) and d.decorator.value == builtin
            for d in self.node.decorators
        )


@dataclass(eq=False)
class ClassInfo:
    """A class defined in the project."""

    node: cst.ClassDef
    module: SourceModule
    bases: list[ClassInfo] = field(default_factory=list)  # those of the project
    external_bases: frozenset[str] = frozenset()  # qualified names of the others
    methods: dict[str, FunctionInfo] = field(default_factory=dict)
    family: ClassInfo | None = None  # the root of its hierarchy in the project

    @property
    def name(self) -> str:
        return self.node.name.value

    def mro(self) -> Iterator[ClassInfo]:
        """This class, then its project bases breadth-first (enough for method lookup)."""
        seen: list[ClassInfo] = []
        queue = [self]
        while queue:
            current = queue.pop(0)
            if current not in seen:
                seen.append(current)
                yield current
                queue.extend(current.bases)

    def method(self, name: str) -> FunctionInfo | None:
        return next((c.methods[name] for c in self.mro() if name in c.methods), None)

    def derives_from(self, *qualified: str) -> bool:
        """Whether a base outside the project is one of `qualified`."""
        return any(q in qualified for c in self.mro() for q in c.external_bases)

    @property
    def is_forwarding_loader(self) -> bool:
        """Whether it is a DataLoader subclass whose `__init__`s (if any) take `*args,
        **kwargs` and hand them all to the base's (Conv-TasNet's `AudioDataLoader`, which
        only sets its own `collate_fn`): a call of it takes a sampler like DataLoader's."""
        if not self.derives_from(DATALOADER):
            return False
        for cls in self.mro():
            init = cls.methods.get("__init__")
            if init is not None and not _forwards_everything(init.node):
                return False
        return True

    @property
    def is_module(self) -> bool:
        """Whether its instances are `torch.nn.Module`s."""
        return any(q.startswith(_MODULE_BASES) for c in self.mro() for q in c.external_bases)


def _forwards_everything(init: cst.FunctionDef) -> bool:
    """`def __init__(self, *args, **kwargs)` that calls `super().__init__(*args, **kwargs)`
    (no `libcst.matchers` here: lint imports this module and not them)."""
    params = init.params
    if (
        len(params.params) != 1
        or params.kwonly_params
        or params.posonly_params
        or not isinstance(params.star_arg, cst.Param)
        or params.star_kwarg is None
    ):
        return False
    star, double = params.star_arg.name.value, params.star_kwarg.name.value
    return any(
        isinstance(call.func, cst.Attribute)
        and call.func.attr.value == "__init__"
        and isinstance(call.func.value, cst.Call)
        and is_name(call.func.value.func, "super")
        and [(a.star, name_key(a.value)) for a in call.args] == [("*", star), ("**", double)]
        for call in find(init.body, cst.Call)
    )


@dataclass(eq=False)
class Obj:
    """An abstract object, made at `node` (a call, definition, display or module)."""

    kind: Kind
    node: cst.CSTNode
    module: SourceModule
    cls: ClassInfo | None = None
    function: FunctionInfo | None = None
    parallel: str | None = None  # "dp" / "ddp": a wrapper; `(obj, "wraps")` holds the model
    source: SourceModule | None = None  # SOURCE_MODULE: the module it stands for

    def __repr__(self) -> str:
        named = self.cls or self.function
        return f"<{self.kind.value}{' ' + named.name if named else ''}>"


Var = tuple[object, object]
Values = frozenset[Obj]
ModuleResolver = Callable[[str, SourceModule], "SourceModule | None"]
CALLED_AT = "called at"  # `(function, CALLED_AT)`: the (module, position) it may run at
LATE = -1  # the position of bindings functions make (`global x`): any time
END = sys.maxsize  # the position after a module's last statement


class At(NamedTuple):
    """A version of a module-level name: `(At(scope, position), name)` holds what the
    top-level statement at `position` binds (`(scope, name)` holds every version)."""

    scope: Scope
    position: int


# The top-level statements whose bindings surely happen once reached.
_UNCONDITIONAL = (cst.SimpleStatementLine, cst.FunctionDef, cst.ClassDef)


class Program:
    """The modules of a project and what their names hold (see the module docstring)."""

    def __init__(
        self, modules: list[SourceModule], resolve_module: ModuleResolver | None = None
    ) -> None:
        """`resolve_module(dotted, origin)` finds a module of the project by its import
        name (default: among `modules`). Call `collect` for each module (or run its
        `ProgramCollector` in a shared walk), then `solve`."""
        self.modules = modules
        by_name = {m.name: m for m in modules}
        self._resolve_module = resolve_module or (lambda name, origin: by_name.get(name))
        self.functions: dict[cst.FunctionDef, FunctionInfo] = {}
        self.classes: dict[cst.ClassDef, ClassInfo] = {}
        self.function_of: dict[cst.CSTNode, FunctionInfo | None] = {}  # calls and loops
        self.module_of: dict[cst.CSTNode, SourceModule] = {}  # calls, loops, definitions
        self.calls: list[cst.Call] = []
        self.loops: list[cst.For | cst.While] = []
        self.callees: dict[cst.Call, set[FunctionInfo]] = {}
        # Generators that yield the items of a parameter (`def log_every(iterable)`):
        # a call of one holds what it passes for that parameter, as `tqdm(loader)` does.
        self.wrapped_parameter: dict[FunctionInfo, str] = {}
        self.values: dict[Var, set[Obj]] = {}
        self._objects: dict[tuple[Kind, int], Obj] = {}
        self._readers: dict[Var, set[int]] = {}
        self._constraints: list[tuple] = []
        self._pending: set[int] = set()
        self._current: int | None = None
        self._functions_by_scope: dict[int, FunctionInfo] = {}
        self._methods_by_name: dict[str, list[tuple[ClassInfo, FunctionInfo]]] | None = None
        self._not_modules: set[tuple[str, int]] = set()  # (dotted, id(origin)) resolving to none
        self._not_imported: set[int] = set()  # ids of names no module of the project binds
        self._exports: dict[int, dict[str, frozenset[str]]] = {}  # id(module) -> its names
        self._following: set[tuple[int, str]] = set()  # names of modules being re-exported
        self._calls_in: dict[FunctionInfo | None, list[cst.Call]] | None = None  # own calls
        self._owners: dict[int, Scope | None] = {}  # id of a name -> the scope it reads
        self._memo: dict[int, set[Obj]] = {}  # id of a node -> `_eval`'s answer, for now
        # (id(module scope), name) -> [(position, unconditional)] of its versions, sorted
        self._versions: dict[tuple[int, str], list[tuple[int, bool]]] = {}
        self._live_versions: dict[tuple[int, str, int], list[int]] = {}
        self._sites: dict[int, int | FunctionInfo | None] = {}  # id of a node -> where it runs
        self._positions: dict[int, dict[int, int]] = {}  # id(tree) -> id(statement) -> index
        self._bind_star_imports()

    def _bind_star_imports(self) -> None:
        """Bind the names each `from module import *` of a module of the project takes
        from it (the star imports of that module first): `random`, `read_file` and
        `CharRNN` of char-rnn's `from helpers import *` and `from model import *`. A
        library's exports are unknown: it binds the names read that nothing else binds
        (`tqdm` of `from tqdm import *`)."""
        done: set[int] = set()  # (a cycle of star imports binds what is bound so far)

        def bind(module: SourceModule) -> None:
            done.add(id(module))
            libraries = []
            for statement, _, _ in module.index.star_imports:
                dotted = _absolute(from_module(statement), module)
                source = self._resolve_module(dotted, module)
                if source is None:
                    libraries.append((statement, dotted))
                    continue
                if id(source) not in done:
                    bind(source)
                module.index.bind_star_import(statement, source.index.exports(source.name))
            unbound = module.index.unbound() if libraries else frozenset()
            for statement, library in libraries:
                exports = {name: frozenset({f"{library}.{name}"}) for name in unbound}
                module.index.bind_star_import(statement, exports)

        for module in self.modules:
            if id(module) not in done:
                bind(module)

    @classmethod
    def of(
        cls, modules: list[SourceModule], resolve_module: ModuleResolver | None = None
    ) -> Program:
        """Collect and solve `modules` in one go."""
        program = cls(modules, resolve_module)
        for module in modules:
            run_visitors(module.tree, [ProgramCollector(program, module)])
        program.solve()
        return program

    def solve(self) -> None:
        for handler, *args in self._constraints:
            if handler is Program._define:
                handler(self, *args)  # classes are linked to their bases by name first
        self._find_versions()  # (which a base's name is read through)
        self._link_classes()
        self._functions_by_scope = {id(f.scope): f for f in self.functions.values()}
        self._pending = set(range(len(self._constraints)))
        self._drain()
        opened: set[FunctionInfo] = set()
        while True:
            # A function no code of the program calls (a library-style Trainer, a
            # callback) receives arguments the analysis cannot see: objects of their own.
            # Such a function, and one only such functions call (or only itself), runs
            # after the module ran as far as the analysis can tell.
            called = {f for functions in self.callees.values() for f in functions}
            fresh = [f for f in self.functions.values() if f not in called and f not in opened]
            unreached = [f for f in self.functions.values() if not self.values.get((f, CALLED_AT))]
            if not fresh and not unreached:
                break
            for function in unreached:
                self._store((function, CALLED_AT), {(function.module, END)})
            for function in fresh:
                opened.add(function)
                params = function.node.params
                own = function.positional[:1] if function.is_method else []
                for param in (*params.posonly_params, *params.params, *params.kwonly_params):
                    if param.name.value not in own:
                        made = self.obj(Kind.EXTERNAL, param, function.module)
                        self._store((function.scope, param.name.value), {made})
            self._drain()

    def _drain(self) -> None:
        while self._pending:
            batch = sorted(self._pending)
            self._pending = set()
            for number in batch:
                self._current = number
                self._memo.clear()  # values read by the last constraint may have grown
                handler, *args = self._constraints[number]
                handler(self, *args)
        self._current = None

    # -- queries ---------------------------------------------------------------------
    def calls_of(self, function: FunctionInfo) -> list[cst.Call]:
        """The calls of the program that may run `function`, in the order of `calls`."""
        return [call for call in self.calls if function in self.callees.get(call, ())]

    def reached_by(self, calls: Iterable[cst.Call]) -> set[FunctionInfo]:
        """The functions of the project `calls` run, directly or through the calls of
        those functions."""
        if self._calls_in is None:
            self._calls_in = {}
            for call in self.calls:
                self._calls_in.setdefault(self.function_of.get(call), []).append(call)
        found: set[FunctionInfo] = set()
        pending = list(calls)
        while pending:
            for function in self.callees.get(pending.pop(), ()):
                if function not in found:
                    found.add(function)
                    pending.extend(self._calls_in.get(function, ()))
        return found

    def values_of(self, node: cst.BaseExpression, module: SourceModule) -> Values:
        """What `node`, an expression of `module`, may hold."""
        self._current = None
        self._memo.clear()
        return frozenset(self._eval(node, module))

    def flat_values_of(self, node: cst.BaseExpression, module: SourceModule) -> Values:
        """`values_of`, with containers replaced by what they hold (recursively)."""
        self._current = None
        self._memo.clear()
        return frozenset(self._flatten(self._eval(node, module)))

    def read(self, var: Var) -> Values:
        return frozenset(self.values.get(var, ()))

    def parameters_of(self, obj: Obj) -> Values:
        """The modules whose parameters a PARAMETERS object yields."""
        return self.read((obj, "of"))

    def objects(self, kind: Kind) -> list[Obj]:
        return [o for o in self._objects.values() if o.kind is kind]

    # -- objects, variables, constraints ----------------------------------------------
    def obj(self, kind: Kind, node: cst.CSTNode, module: SourceModule, **extra: object) -> Obj:
        key = (kind, id(node))
        found = self._objects.get(key)
        if found is None:
            found = self._objects[key] = Obj(kind, node, module, **extra)  # type: ignore[arg-type]
        return found

    def add_constraint(self, handler: Callable[..., None], *args: object) -> None:
        self._constraints.append((handler, *args))

    def _read(self, var: Var) -> set[Obj]:
        if self._current is not None:
            self._readers.setdefault(var, set()).add(self._current)
        return self.values.get(var, set())

    def _store(self, var: Var, values: Iterable[Obj]) -> None:
        current = self.values.setdefault(var, set())
        before = len(current)
        current.update(values)
        if len(current) != before:
            self._pending.update(self._readers.get(var, ()))

    def _link_classes(self) -> None:
        for info in self.classes.values():
            external: set[str] = set()
            for base in info.node.bases:
                local = [o.cls for o in self._eval(base.value, info.module) if o.kind is Kind.CLASS]
                info.bases.extend(c for c in local if c is not None)
                if not local:
                    external |= info.module.index.qualified_names(base.value)
            info.external_bases = frozenset(external)
        for info in self.classes.values():
            root = info
            while root.bases and root.bases[0] is not info:
                root = root.bases[0]
            info.family = root

    # -- constraint handlers: `handler(self, *args)` -----------------------------------
    def _define(self, node: cst.FunctionDef | cst.ClassDef, module: SourceModule) -> None:
        scope = module.index.scopes[node]
        if isinstance(node, cst.FunctionDef):
            made = self.obj(Kind.FUNCTION, node, module, function=self.functions[node])
        else:
            made = self.obj(Kind.CLASS, node, module, cls=self.classes[node])
        self._store_name(scope.owner(node.name.value), node.name, {made}, module)

    def _assign(
        self, targets: list[cst.BaseExpression], value: cst.BaseExpression, module: SourceModule
    ) -> None:
        values = self._eval(value, module)
        for target in targets:
            self._store_target(target, values, module)

    def _iterate(
        self, target: cst.BaseExpression, iterable: cst.BaseExpression, module: SourceModule
    ) -> None:
        self._store_target(target, self._elements(self._eval(iterable, module)), module)

    def _return(self, function: FunctionInfo, value: cst.BaseExpression) -> None:
        self._store((function, "return"), self._eval(value, function.module))

    def _display(self, node: cst.CSTNode, module: SourceModule) -> None:
        """A tuple/list/set/dict display or comprehension: its elements, by position or key."""
        container = self.obj(Kind.CONTAINER, node, module)
        if isinstance(node, (cst.Tuple, cst.List, cst.Set)):
            for position, element in enumerate(node.elements):
                if isinstance(element, cst.StarredElement):
                    self._store((container, "*"), self._elements(self._eval(element.value, module)))
                    continue
                values = self._eval(element.value, module)
                self._store((container, position), values)
                self._store((container, "*"), values)
        elif isinstance(node, cst.Dict):
            for element in node.elements:
                if isinstance(element, cst.DictElement):
                    values = self._eval(element.value, module)
                    if isinstance(element.key, cst.SimpleString):
                        self._store((container, element.key.evaluated_value), values)
                    self._store((container, "*"), values)
        elif isinstance(node, cst.DictComp):
            self._store((container, "*"), self._eval(node.value, module))
        else:  # ListComp, SetComp, GeneratorExp
            self._store((container, "*"), self._eval(node.elt, module))  # type: ignore[attr-defined]

    def _call_site(self, call: cst.Call, module: SourceModule) -> None:
        """Bind the arguments of `call` to the parameters of what it runs."""
        names = _library_names(call.func, module)
        if names & _WRAPPERS:
            model = argument(call, 0, "module")
            if model is not None:
                for obj in self._eval(call, module):
                    self._store((obj, "wraps"), self._eval(model, module))
            return
        if isinstance(call.func, cst.Attribute) and call.func.attr.value in PARAMETER_METHODS:
            for obj in self._eval(call, module):
                self._store((obj, "of"), self._trained_part(call.func.value, module))
            return
        called: set[FunctionInfo] = set()
        for function, bound in self._targets(call, module):
            called.add(function)
            self._bind(function, call, bound, module)
        for arg in call.args:
            # a function of the project passed along is called back (`optimizer.step(closure)`)
            for obj in self._eval(arg.value, module):
                if obj.kind is Kind.FUNCTION and obj.function is not None:
                    called.add(obj.function)
        if called:
            self.callees.setdefault(call, set()).update(called)
            times = self._times_of(call, module)
            for function in called:
                self._store((function, CALLED_AT), times)

    def _bind(
        self, function: FunctionInfo, call: cst.Call, bound: set[Obj] | None, module: SourceModule
    ) -> None:
        params = function.positional
        if bound is not None and params:
            self._store((function.scope, params[0]), bound)
            params = params[1:]
        positional = [a for a in call.args if a.keyword is None]
        for param, arg in zip(params, positional):
            if arg.star:
                break
            self._store((function.scope, param), self._eval(arg.value, module))
        for arg in call.args:
            if arg.keyword is not None:
                values = self._eval(arg.value, module)
                self._store((function.scope, arg.keyword.value), values)
                if function.node.params.star_kwarg is not None:
                    # what `**kwargs` holds, for a call that hands it on
                    # (`super().__init__(**kwargs)`)
                    self._store((function.scope, f"**{arg.keyword.value}"), values)
            elif arg.star == "**":
                self._forward_keywords(function, arg.value, module)

    def _forward_keywords(
        self, function: FunctionInfo, passed: cst.BaseExpression, module: SourceModule
    ) -> None:
        """Bind the parameters of `function` to the keyword arguments that the caller's
        `**kwargs`, passed on as `passed`, received."""
        owner = self._owner(passed, module) if isinstance(passed, cst.Name) else None
        caller = self.function_of_scope(owner) if owner is not None else None
        star = caller.node.params.star_kwarg if caller is not None else None
        if not isinstance(star, cst.Param) or star.name.value != passed.value:  # type: ignore[attr-defined]
            return
        params = function.node.params
        for param in (*params.posonly_params, *params.params, *params.kwonly_params):
            name = param.name.value
            self._store((function.scope, name), self._read((caller.scope, f"**{name}")))  # type: ignore[union-attr]

    # -- module-level names, read in order ---------------------------------------------
    def _find_versions(self) -> None:
        """The positions where each module-level name is bound, from the constraints
        that store names (before any is solved: a read must know every version)."""
        found: dict[tuple[int, str], dict[int, bool]] = {}
        for handler, *args in self._constraints:
            if handler is Program._define:
                names, module = [args[0].name], args[1]
            elif handler is Program._assign:
                names, module = [n for t in args[0] for n in bound_name_nodes(t)], args[2]
            elif handler is Program._iterate:
                names, module = bound_name_nodes(args[0]), args[2]
            else:
                continue
            for name in names:
                scope = module.index.scopes.get(name)
                owner = scope.owner(name.value) if scope is not None else None
                if owner is not None and owner is owner.module:
                    position, unconditional = self._binding_position(name, module)
                    versions = found.setdefault((id(owner), name.value), {})
                    versions[position] = versions.get(position, False) or unconditional
        self._versions = {key: sorted(versions.items()) for key, versions in found.items()}

    def _binding_position(self, name: cst.Name, module: SourceModule) -> tuple[int, bool]:
        """The top-level statement binding `name` (LATE for a function's `global x`)
        and whether reaching it surely binds the name."""
        site = self._site(name, module)
        if not isinstance(site, int):
            return LATE, False
        statement = module.tree.body[site]
        walrus = isinstance(module.index.parent(name), cst.NamedExpr)
        return site, isinstance(statement, _UNCONDITIONAL) and not walrus

    def _site(self, node: cst.CSTNode, module: SourceModule) -> int | FunctionInfo | None:
        """Where `node` runs: the position of its top-level statement (module-level code,
        class bodies included), the function whose body holds it, or None in a lambda."""
        key = id(node)
        if key not in self._sites:
            parents = module.index.parents
            child, parent = node, parents.get(node)
            site: int | FunctionInfo | None = None
            while parent is not None:
                if isinstance(parent, (cst.FunctionDef, cst.Lambda)) and child is parent.body:
                    site = (
                        self.functions.get(parent) if isinstance(parent, cst.FunctionDef) else None
                    )
                    break
                if parent is module.tree:
                    site = self._statement_positions(module).get(id(child))
                    break
                child, parent = parent, parents.get(parent)
            self._sites[key] = site
        return self._sites[key]

    def _statement_positions(self, module: SourceModule) -> dict[int, int]:
        found = self._positions.get(id(module.tree))
        if found is None:
            found = {id(s): i for i, s in enumerate(module.tree.body)}
            self._positions[id(module.tree)] = found
        return found

    def _times_of(self, node: cst.CSTNode, module: SourceModule) -> set[tuple[SourceModule, int]]:
        """When `node` may run: (module, position) of the top-level statements running it."""
        site = self._site(node, module)
        if isinstance(site, FunctionInfo):
            return self._read((site, CALLED_AT))  # type: ignore[return-value]
        return {(module, END if site is None else site)}

    def _read_global(self, owner: Scope, node: cst.Name, module: SourceModule) -> set[Obj]:
        """What the module-level name `node` holds where it is read."""
        if (id(owner), node.value) not in self._versions:
            return set()  # bound by imports alone
        found: set[Obj] = set()
        for origin, position in self._times_of(node, module):
            if origin.scope is owner and position != END:
                found |= self._read_at(owner, node.value, position, origin.tree.body[position])
            else:  # another module's code runs after this one was imported
                found |= self._read_at(owner, node.value, END)
        return found

    def _read_at(
        self, owner: Scope, name: str, at: int, statement: cst.CSTNode | None = None
    ) -> set[Obj]:
        """What the module-level `name` of `owner` holds while `statement`, the one at
        position `at`, runs (None: after the module ran)."""
        found: set[Obj] = set()
        for position in self._live(owner, name, at, statement):
            found |= self._read((At(owner, position), name))
        return found

    def _live(self, owner: Scope, name: str, at: int, statement: cst.CSTNode | None) -> list[int]:
        """The versions of a module-level name that may be seen at position `at`: the
        conditional ones before it back to the last unconditional one, those functions
        bind, and the statement's own when its code may run after it binds (a loop, an
        `if`; not `x = f(x)`)."""
        key = (id(owner), name, at)
        live = self._live_versions.get(key)
        if live is None:
            own = statement is not None and _reads_own_bindings(statement)
            versions = self._versions.get((id(owner), name), [])
            live = self._live_versions[key] = _reaching(versions, at, own)
        return live

    def _store_name(
        self, owner: Scope, name: cst.Name, values: Iterable[Obj], module: SourceModule
    ) -> None:
        """Store into a plain name; a module-level one also into its version."""
        values = set(values)
        if owner is owner.module:
            position, _ = self._binding_position(name, module)
            self._store((At(owner, position), name.value), values)
        self._store((owner, name.value), values)

    # -- evaluation ------------------------------------------------------------------
    def _eval(self, node: cst.CSTNode, module: SourceModule) -> set[Obj]:
        """What `node` may hold now. Kept until the next constraint or query: a call
        chain (`k.replace(...).replace(...)`) evaluates each receiver from several
        places, which without the memo costs 4**n evaluations for n calls."""
        found = self._memo.get(id(node))
        if found is None:
            found = self._memo[id(node)] = self._evaluate(node, module)
        return found

    def _evaluate(self, node: cst.CSTNode, module: SourceModule) -> set[Obj]:
        kind = type(node)
        if kind is cst.Name:
            return self._name(node, module)  # type: ignore[arg-type]
        if kind is cst.Attribute:
            return self._attribute(node, module)  # type: ignore[arg-type]
        if kind is cst.Call:
            return self._call(node, module)  # type: ignore[arg-type]
        if kind is cst.IfExp:
            return self._eval(node.body, module) | self._eval(node.orelse, module)  # type: ignore[attr-defined]
        if kind is cst.BooleanOperation:
            return self._eval(node.left, module) | self._eval(node.right, module)  # type: ignore[attr-defined]
        if kind is cst.NamedExpr:
            return self._eval(node.value, module)  # type: ignore[attr-defined]
        if kind is cst.BinaryOperation and isinstance(node.operator, cst.Add):  # type: ignore[attr-defined]
            return self._concatenated(node, module)  # type: ignore[arg-type]
        if kind in _DISPLAYS:
            return {self.obj(Kind.CONTAINER, node, module)}
        if kind is cst.Subscript:
            return self._subscript(node, module)  # type: ignore[arg-type]
        if kind is cst.SimpleString and is_device_string(node):  # type: ignore[arg-type]
            return {self.obj(Kind.DEVICE, node, module)}
        return set()

    def _concatenated(self, node: cst.BinaryOperation, module: SourceModule) -> set[Obj]:
        """`list(encoder.parameters()) + list(decoder.parameters())`: a sequence that
        holds what both sides hold (only sequences and parameters: `+` of anything else
        makes a value the analysis does not track)."""
        both = self._eval(node.left, module) | self._eval(node.right, module)
        return {obj for obj in both if obj.kind in (Kind.CONTAINER, Kind.PARAMETERS)}

    def _name(self, node: cst.Name, module: SourceModule) -> set[Obj]:
        imported = self._imported(node, module)
        if imported is not None:
            return imported
        owner = self._owner(node, module)
        if owner is None:
            return set()
        if owner is owner.module:
            return self._read_global(owner, node, module)
        return self._read((owner, node.value))

    def _owner(self, node: cst.Name, module: SourceModule) -> Scope | None:
        """The scope whose binding `node` reads (scopes are fixed: found once a node)."""
        key = id(node)
        if key not in self._owners:
            scope = module.index.scopes.get(node)
            self._owners[key] = binding_scope(scope, node.value) if scope is not None else None
        return self._owners[key]

    def _imported(self, node: cst.CSTNode, module: SourceModule) -> set[Obj] | None:
        """What a name bound by an import of one of the project's modules holds."""
        if id(node) in self._not_imported:  # the same answer every time it is evaluated
            return None
        names = _library_names(node, module)
        for name in names:
            found = self._project_name(name, module)
            if found is not None:
                return found
        if not names.isdisjoint(TENSOR_TYPES):
            return {self.obj(Kind.TENSOR_TYPE, node, module)}
        self._not_imported.add(id(node))
        return None

    def _project_name(self, dotted: str, origin: SourceModule) -> set[Obj] | None:
        key = (dotted, id(origin))
        if key in self._not_modules:  # most names: `torch.nn.Linear` is no module of ours
            return None
        found = self._project_name_values(dotted, origin)
        if found is None:
            self._not_modules.add(key)
        return found

    def _project_name_values(self, dotted: str, origin: SourceModule) -> set[Obj] | None:
        pieces = _absolute(dotted, origin).split(".")
        for cut in range(len(pieces), 0, -1):
            target = self._resolve_module(".".join(pieces[:cut]), origin)
            if target is None:
                continue
            values = {self.obj(Kind.SOURCE_MODULE, target.tree, target, source=target)}
            for attr in pieces[cut:]:
                values = self._attribute_of(values, attr)
            return values
        return None

    def _attribute(self, node: cst.Attribute, module: SourceModule) -> set[Obj]:
        imported = self._imported(node, module)
        if imported is not None:
            return imported
        own = self.class_of_self(node.value, module)
        if own is not None:
            return self._read((own.family, node.attr.value))
        return self._attribute_of(self._eval(node.value, module), node.attr.value)

    def _attribute_of(self, values: Iterable[Obj], attr: str) -> set[Obj]:
        found: set[Obj] = set()
        for obj in values:
            if obj.parallel and attr == "module":
                found |= self._read((obj, "wraps"))
            elif obj.cls is not None and obj.kind in (Kind.MODULE, Kind.INSTANCE):
                found |= self._read((obj.cls.family, attr))
            elif obj.kind is Kind.SOURCE_MODULE and obj.source is not None:
                found |= self._read_at(obj.source.scope, attr, END) or self._reexported(
                    obj.source, attr
                )
                nested = self._resolve_module(f"{obj.source.name}.{attr}", obj.source)
                if nested is not None:
                    found.add(self.obj(Kind.SOURCE_MODULE, nested.tree, nested, source=nested))
        return found

    def _reexported(self, source: SourceModule, attr: str) -> set[Obj]:
        """What the name `attr` of `source` holds when an import of `source` binds it: a
        package's `from .base import Trainer`, read as `pkg.Trainer`."""
        exports = self._exports.get(id(source))
        if exports is None:
            exports = self._exports[id(source)] = source.index.exports(source.name)
        key = (id(source), attr)
        if key in self._following:
            return set()  # a cycle of imports
        self._following.add(key)
        found: set[Obj] = set()
        for dotted in exports.get(attr, ()):
            found |= self._project_name(dotted, source) or set()
        self._following.discard(key)
        return found

    def _subscript(self, node: cst.Subscript, module: SourceModule) -> set[Obj]:
        key = _literal_key(node)
        found: set[Obj] = set()
        for obj in self._eval(node.value, module):
            if obj.kind is Kind.CONTAINER:
                exact = self._read((obj, key)) if key is not None else set()
                found |= exact or self._read((obj, "*"))
        return found

    def _call(self, node: cst.Call, module: SourceModule) -> set[Obj]:
        built = self._library_call(node, _library_names(node.func, module), module)
        if built is not None:
            return built
        if isinstance(node.func, cst.Attribute):
            method = node.func.attr.value
            if method in PARAMETER_METHODS:
                return {self.obj(Kind.PARAMETERS, node, module)}
            if method in _SELF_RETURNING:
                receiver = self._eval(node.func.value, module)
                kept = {o for o in receiver if o.kind in _MODEL_LIKE}
                if kept:
                    return kept
        found = self._constructed(node, module)
        for function, bound in self._targets(node, module):
            wrapped = self.wrapped_parameter.get(function)
            if wrapped is not None:
                positional = function.positional[1:] if bound is not None else function.positional
                passed = (
                    argument(node, positional.index(wrapped), wrapped)
                    if wrapped in positional
                    else None
                )
                if passed is not None:
                    found |= self._eval(passed, module)
            if function.name != "__init__":
                found |= self._read((function, "return"))
        root = _dotted_root(node.func)
        if not found and root is not None and self._unbound(root, module):
            # `Net()` or `nn.Linear()` where the name comes from a star import or code
            # the program lacks
            return {self.obj(Kind.EXTERNAL, node, module)}
        return found

    def _unbound(self, node: cst.Name, module: SourceModule) -> bool:
        scope = module.index.scopes.get(node)
        return (
            scope is not None
            and binding_scope(scope, node.value) is None
            and not module.index.qualified_names(node)
        )

    def _constructed(self, node: cst.Call, module: SourceModule) -> set[Obj]:
        """The instance a call of a project class makes."""
        made: set[Obj] = set()
        for obj in self._eval(node.func, module):
            if obj.kind is Kind.CLASS and obj.cls is not None:
                kind = Kind.MODULE if obj.cls.is_module else Kind.INSTANCE
                if obj.cls.is_forwarding_loader:
                    kind = Kind.LOADER
                made.add(self.obj(kind, node, module, cls=obj.cls))
        return made

    def _library_call(
        self, node: cst.Call, names: frozenset[str], module: SourceModule
    ) -> set[Obj] | None:
        """What a call of torch (or a wrapper such as tqdm) returns; None for other calls."""
        if not names:
            return None
        if DATALOADER in names:
            return {self.obj(Kind.LOADER, node, module)}
        if TENSOR_DATASET in names:
            return {self.obj(Kind.TENSOR_DATASET, node, module)}
        if names & _WRAPPERS:
            parallel = "dp" if DATA_PARALLEL in names else "ddp"
            return {self.obj(Kind.MODULE, node, module, parallel=parallel)}
        if any(n.startswith("torch.optim.") and n.count(".") == 2 for n in names):
            return {self.obj(Kind.OPTIMIZER, node, module)}
        if is_loss_module(names):
            return {self.obj(Kind.CRITERION, node, module)}
        if names & _DEVICE_CALLS:
            return {self.obj(Kind.DEVICE, node, module)}
        if any(_is_model_factory(n) for n in names):
            return {self.obj(Kind.MODULE, node, module)}
        if names & _PASS_THROUGH or any(n.startswith(_PASS_THROUGH_MODULES) for n in names):
            found: set[Obj] = set()
            for arg in node.args:
                if arg.keyword is None and not arg.star:
                    found |= self._eval(arg.value, module)
            return found
        if (
            not any(n.startswith(("torch.", "builtins.")) for n in names)
            and self._imported(node.func, module) is None
        ):
            # `Net()` of `from model import Net` when model.py is not part of the program
            return {self.obj(Kind.EXTERNAL, node, module)}
        return None

    def _targets(
        self, call: cst.Call, module: SourceModule
    ) -> list[tuple[FunctionInfo, set[Obj] | None]]:
        """The project functions `call` runs, each with what its first parameter is bound
        to (None when the call passes every argument itself, as for a plain function)."""
        func = call.func
        found: list[tuple[FunctionInfo, set[Obj] | None]] = []
        if isinstance(func, cst.Attribute) and _is_super(func.value):
            return self._base_method(call, func.attr.value, module)
        if isinstance(func, cst.Attribute):
            own = self.class_of_self(func.value, module)
            if own is not None:
                receiver = self._eval(func.value, module)
                return [
                    (info, receiver if info.is_method else None)
                    for info in self._overrides(own, func.attr.value)
                ]
        for obj in self._eval(func, module):
            if obj.kind is Kind.FUNCTION and obj.function is not None:
                found.append((obj.function, None))
            elif obj.kind is Kind.CLASS and obj.cls is not None:
                init = obj.cls.method("__init__")
                if init is not None:
                    made = {o for o in self._constructed(call, module) if o.cls is obj.cls}
                    found.append((init, made))
            elif obj.kind is Kind.MODULE:
                for model in self._read((obj, "wraps")) if obj.parallel else {obj}:
                    forward = _entry(model.cls) if model.cls is not None else None
                    if forward is not None:
                        found.append((forward, {model}))
            elif obj.kind is Kind.INSTANCE and obj.cls is not None:
                # an instance of a class of the project called like a function (a loss
                # scaler whose `__call__` runs the backward pass)
                method = obj.cls.method("__call__")
                if method is not None:
                    found.append((method, {obj}))
        if isinstance(func, cst.Attribute) and not found:
            for obj in self._eval(func.value, module):
                if obj.cls is not None and obj.kind in (Kind.MODULE, Kind.INSTANCE):
                    info = obj.cls.method(func.attr.value)
                    if info is not None:
                        found.append((info, {obj} if info.is_method else None))
                elif obj.kind is Kind.CLASS and obj.cls is not None:
                    # `Sampler.from_training(run_dir)`: a class method gets the class;
                    # a method called through its class is given every argument
                    info = obj.cls.method(func.attr.value)
                    if info is not None:
                        found.append((info, {obj} if info.is_classmethod else None))
        return found

    def _base_method(
        self, call: cst.Call, name: str, module: SourceModule
    ) -> list[tuple[FunctionInfo, set[Obj] | None]]:
        """`super().name(...)` in a method: the method of a base of its class, bound to
        the method's `self`."""
        caller = self._site(call, module)
        if not isinstance(caller, FunctionInfo) or caller.cls is None or not caller.is_method:
            return []
        bases = [c for c in caller.cls.mro() if c is not caller.cls and name in c.methods]
        if not bases:
            return []
        method = bases[0].methods[name]
        receiver = self._read((caller.scope, caller.positional[0])) if caller.positional else None
        return [(method, receiver if method.is_method else None)]

    def _overrides(self, own: ClassInfo, name: str) -> list[FunctionInfo]:
        """`self.name(...)` in a method of `own`: the method `own` resolves, and the
        overrides of its subclasses (the instance may be one of them)."""
        found = [f] if (f := own.method(name)) is not None else []
        for info, method in self._methods_named().get(name, ()):
            if method not in found and own in info.mro():
                found.append(method)
        return found

    def _methods_named(self) -> dict[str, list[tuple[ClassInfo, FunctionInfo]]]:
        """Each method name with the classes that define it (a look-up per `self.x()`
        call instead of a scan of every class)."""
        if self._methods_by_name is None:
            self._methods_by_name = {}
            for info in self.classes.values():
                for name, method in info.methods.items():
                    self._methods_by_name.setdefault(name, []).append((info, method))
        return self._methods_by_name

    # -- helpers ---------------------------------------------------------------------
    def function_of_scope(self, scope: Scope) -> FunctionInfo | None:
        """The function whose own namespace `scope` is (None for a module, class or
        comprehension)."""
        return self._functions_by_scope.get(id(scope))

    def class_of_self(self, node: cst.BaseExpression, module: SourceModule) -> ClassInfo | None:
        """The class whose method reads `node`, when `node` is that method's `self`."""
        if not isinstance(node, cst.Name):
            return None
        owner = self._owner(node, module)
        function = self._functions_by_scope.get(id(owner)) if owner is not None else None
        if function is None or not function.is_method or function.positional[:1] != [node.value]:
            return None
        return function.cls

    def _trained_part(self, receiver: cst.BaseExpression, module: SourceModule) -> set[Obj]:
        """The model whose parameters `receiver.parameters()` yields: the root of an
        attribute chain (`model.fc.parameters()` trains part of `model`)."""
        root = receiver
        while isinstance(root, cst.Attribute) and self.class_of_self(root.value, module) is None:
            root = root.value
        found = {o for o in self._eval(root, module) if o.kind in _MODEL_LIKE}
        own = self.class_of_self(root, module)
        if own is not None and own.is_module:
            found.add(self.obj(Kind.MODULE, own.node, own.module, cls=own))
        return found

    def _elements(self, values: Iterable[Obj]) -> set[Obj]:
        """What iterating over `values` yields (a loader yields batches: not tracked)."""
        found: set[Obj] = set()
        for obj in values:
            if obj.kind is Kind.CONTAINER:
                found |= self._read((obj, "*"))
            elif obj.kind is Kind.PARAMETERS:
                found.add(obj)
        return found

    def _flatten(self, values: Iterable[Obj]) -> set[Obj]:
        found: set[Obj] = set()
        stack = list(values)
        while stack:
            obj = stack.pop()
            if obj in found:
                continue
            found.add(obj)
            if obj.kind is Kind.CONTAINER:
                stack.extend(self._read((obj, "*")))
        return {o for o in found if o.kind is not Kind.CONTAINER}

    def _store_target(
        self, target: cst.BaseExpression, values: set[Obj], module: SourceModule
    ) -> None:
        if isinstance(target, cst.Name):
            scope = module.index.scopes.get(target)
            if scope is not None:
                self._store_name(scope.owner(target.value), target, values, module)
        elif isinstance(target, cst.Attribute):
            own = self.class_of_self(target.value, module)
            if own is not None:
                self._store((own.family, target.attr.value), values)
                return
            for obj in self._eval(target.value, module):
                if obj.cls is not None and obj.kind in (Kind.MODULE, Kind.INSTANCE):
                    self._store((obj.cls.family, target.attr.value), values)
        elif isinstance(target, (cst.Tuple, cst.List)):
            # unpacked by position from displays; anything else (the `(name, param)` pairs
            # of `named_parameters()`) may end up in any of the names
            containers = [o for o in values if o.kind is Kind.CONTAINER]
            others = values.difference(containers)
            for position, element in enumerate(target.elements):
                if not isinstance(element, cst.StarredElement):
                    part = set(others)
                    for container in containers:
                        part |= self._read((container, position))
                    self._store_target(element.value, part, module)
        elif isinstance(target, cst.Subscript):
            key = _literal_key(target)
            for obj in self._eval(target.value, module):
                if obj.kind is Kind.CONTAINER:
                    if key is not None:
                        self._store((obj, key), values)
                    self._store((obj, "*"), values)


# What `.to(device)` returns itself and whose `.parameters()` may train.
_MODEL_LIKE = frozenset({Kind.MODULE, Kind.CRITERION, Kind.EXTERNAL})
_DISPLAYS = frozenset(
    {
        cst.Tuple,
        cst.List,
        cst.Set,
        cst.Dict,
        cst.ListComp,
        cst.SetComp,
        cst.GeneratorExp,
        cst.DictComp,
    }
)


def _reaching(versions: list[tuple[int, bool]], at: int, own: bool) -> list[int]:
    """The positions among `versions` (sorted `(position, unconditional)` pairs) whose
    bindings a read at position `at` may see; `own`: that position's bindings too."""
    live: list[int] = []
    earlier = True  # no unconditional binding between the read and the positions left
    for position, unconditional in reversed(versions):
        if position == LATE or (position == at and own):
            live.append(position)
        elif position < at and earlier:
            live.append(position)
            earlier = not unconditional
    return live


def _reads_own_bindings(statement: cst.CSTNode) -> bool:
    """Whether code of a top-level statement may run after the statement bound a name:
    a compound statement (a loop, `if`, `with`, `try`) or a line of several statements.
    A `def` or `class` binds its name last, an assignment after its value."""
    if isinstance(statement, cst.SimpleStatementLine):
        return len(statement.body) > 1
    return not isinstance(statement, (cst.FunctionDef, cst.ClassDef))


def _absolute(dotted: str, origin: SourceModule) -> str:
    """`dotted` as imported by `origin`, a relative name (`.data`) made absolute."""
    if not dotted.startswith("."):
        return dotted
    level = len(dotted) - len(dotted.lstrip("."))
    package = origin.package.split(".") if origin.package else []
    package = package[: len(package) - level + 1]
    return ".".join([*package, dotted.lstrip(".")]).strip(".")


def _is_super(node: cst.BaseExpression) -> bool:
    """`super()` (without arguments)."""
    return isinstance(node, cst.Call) and not node.args and is_name(node.func, "super")


def _dotted_root(node: cst.BaseExpression) -> cst.Name | None:
    """`a` of `a`, `a.b` or `a.b.c`; None for anything else (calls, subscripts)."""
    while isinstance(node, cst.Attribute):
        node = node.value
    return node if isinstance(node, cst.Name) else None


def binding_scope(scope: Scope, name: str) -> Scope | None:
    """The scope whose binding of `name` a read in `scope` sees (None: builtin/unknown)."""
    current: Scope | None = scope
    while current is not None:
        redirect = current.redirects.get(name)
        if redirect is not None and redirect is not current:
            return redirect.owner(name)
        if name in current.bindings:
            return current
        current = current._visible_parent()
    return None


def is_device_string(node: cst.BaseExpression) -> bool:
    """`"cuda"`, `"cuda:0"`, `"cpu"`, `"mps"`, `"xpu"`."""
    if not isinstance(node, cst.SimpleString):
        return False
    text = node.evaluated_value
    return isinstance(text, str) and text.split(":")[0] in _DEVICE_STRINGS


def _library_names(node: cst.CSTNode, module: SourceModule) -> frozenset[str]:
    """Qualified names of `node` when it is a dotted name (`torch.optim.SGD`); none for
    a call chain such as `nn.Linear(2, 2).to`, which names a method, not `torch.nn.Linear.to`."""
    inner = node
    while isinstance(inner, cst.Attribute):
        inner = inner.value
    return module.index.qualified_names(node) if isinstance(inner, cst.Name) else frozenset()


def _is_model_factory(name: str) -> bool:
    """`torch.nn.Linear`, `torchvision.models.resnet50`, `timm.create_model`, `X.from_pretrained`
    (not `torch.nn.functional.relu`, `torch.nn.init.normal_`)."""
    if name.startswith("torch.nn."):
        last = name.rsplit(".", 1)[1]
        return name.count(".") == 2 and last[:1].isupper()
    return name.startswith(("torchvision.models.", "timm.create_model")) or name.endswith(
        ".from_pretrained"
    )


def _literal_key(node: cst.Subscript) -> int | str | None:
    if len(node.slice) != 1 or not isinstance(node.slice[0].slice, cst.Index):
        return None
    value = node.slice[0].slice.value
    if isinstance(value, cst.Integer):
        return int(value.value)
    if isinstance(value, cst.SimpleString):
        text = value.evaluated_value
        return text if isinstance(text, str) else None
    return None


def argument(call: cst.Call, position: int, keyword: str) -> cst.BaseExpression | None:
    """The argument `call` passes for a parameter, by keyword or by position."""
    for arg in call.args:
        if arg.keyword is not None and arg.keyword.value == keyword:
            return arg.value
    positional = [a for a in call.args if a.keyword is None and not a.star]
    return positional[position].value if position < len(positional) else None


def _yielded_iterable(node: cst.Yield, function: FunctionInfo) -> cst.BaseExpression | None:
    """`x` of `yield from x`, or of `for item in x: ... yield item` in `function`."""
    if isinstance(node.value, cst.From):
        return node.value.item
    if not isinstance(node.value, cst.Name):
        return None
    index = function.module.index
    for ancestor in index.ancestors(node):
        if ancestor is function.node:
            return None
        if not isinstance(ancestor, cst.For):
            continue
        iterated = ancestor.iter
        target = ancestor.target
        if (
            isinstance(iterated, cst.Call)
            and isinstance(target, cst.Tuple)
            and len(target.elements) == 2
            and iterated.args
            and "builtins.enumerate" in index.qualified_names(iterated.func)
        ):
            # `for i, item in enumerate(x): yield item`
            iterated, target = iterated.args[0].value, target.elements[1].value
        if isinstance(target, cst.Name) and target.value == node.value.value:
            return iterated
    return None


class ProgramCollector:
    """A visitor (see `run_visitors`) that records a module's definitions and a
    constraint for every assignment, call, return, `for` target and display."""

    def __init__(self, program: Program, module: SourceModule) -> None:
        self.program = program
        self.module = module
        self.functions: list[FunctionInfo | None] = [None]
        self.classes: list[ClassInfo | None] = [None]

    def _add(self, handler: Callable[..., None], *args: object) -> None:
        self.program.add_constraint(handler, *args)

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        cls = self.classes[-1] if self.functions[-1] is None else None
        info = FunctionInfo(node, self.module, self.module.index.scopes[node.body], cls)
        self.program.functions[node] = info
        self.program.module_of[node] = self.module
        if cls is not None:
            cls.methods.setdefault(info.name, info)
        else:
            self._add(Program._define, node, self.module)
        self.functions.append(info)
        self.classes.append(None)

    def leave_FunctionDef(self, node: cst.FunctionDef) -> None:
        self.functions.pop()
        self.classes.pop()

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        info = ClassInfo(node, self.module)
        self.program.classes[node] = info
        self.program.module_of[node] = self.module
        if self.classes[-1] is None:
            self._add(Program._define, node, self.module)
        self.classes.append(info)

    def leave_ClassDef(self, node: cst.ClassDef) -> None:
        self.classes.pop()

    def visit_Assign(self, node: cst.Assign) -> None:
        self._add(Program._assign, [t.target for t in node.targets], node.value, self.module)

    def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
        if node.value is not None:
            self._add(Program._assign, [node.target], node.value, self.module)

    def visit_NamedExpr(self, node: cst.NamedExpr) -> None:
        self._add(Program._assign, [node.target], node.value, self.module)

    def visit_WithItem(self, node: cst.WithItem) -> None:
        if node.asname is not None:
            self._add(Program._assign, [node.asname.name], node.item, self.module)

    def visit_For(self, node: cst.For) -> None:
        self._loop(node)
        self._add(Program._iterate, node.target, node.iter, self.module)

    def visit_While(self, node: cst.While) -> None:
        self._loop(node)

    def _loop(self, node: cst.For | cst.While) -> None:
        self.program.loops.append(node)
        self.program.function_of[node] = self.functions[-1]
        self.program.module_of[node] = self.module

    def visit_CompFor(self, node: cst.CompFor) -> None:
        self._add(Program._iterate, node.target, node.iter, self.module)

    def visit_Return(self, node: cst.Return) -> None:
        function = self.functions[-1]
        if function is not None and node.value is not None:
            self._add(Program._return, function, node.value)

    def visit_Yield(self, node: cst.Yield) -> None:
        # A generator that yields the items of an iterable it loops over (a logger's
        # `log_every(loader)`, a prefetcher) wraps that iterable, as `tqdm(loader)` does.
        function = self.functions[-1]
        if function is None or node.value is None:
            return
        iterated = _yielded_iterable(node, function)
        if iterated is None:
            return
        if isinstance(iterated, cst.Name) and iterated.value in function.positional:
            # a parameter: each call wraps what it passes (`log_every(train_loader)`)
            self.program.wrapped_parameter[function] = iterated.value
        else:
            self._add(Program._return, function, iterated)

    def visit_Call(self, node: cst.Call) -> None:
        self.program.calls.append(node)
        self.program.function_of[node] = self.functions[-1]
        self.program.module_of[node] = self.module
        self._add(Program._call_site, node, self.module)

    def _display(self, node: cst.CSTNode) -> None:
        self._add(Program._display, node, self.module)

    visit_Tuple = visit_List = visit_Set = visit_Dict = _display
    visit_ListComp = visit_SetComp = visit_GeneratorExp = visit_DictComp = _display


def _entry(cls: ClassInfo) -> FunctionInfo | None:
    """What calling a module of `cls` runs: `forward`, or a `__call__` the project's class
    defines that computes itself (pix2pix's GAN loss never calls `forward`), not one that
    hands over to `nn.Module.__call__` (`return super().__call__(x)`, for type hints)."""
    call = cls.method("__call__")
    if call is not None and not any(
        isinstance(c.func, cst.Attribute) and c.func.attr.value == "__call__"
        for c in find(call.node.body, cst.Call)
    ):
        return call
    return cls.method("forward")
