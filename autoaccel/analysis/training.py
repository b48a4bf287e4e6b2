"""Where a program trains: its step loops, found through calls, and what they train.

A *step loop* is a loop over batches from which `.backward()` is reachable, in its own
body or through calls of the project's functions (`for x, y in loader: train_step(...)`,
`Trainer._run_epoch` -> `_run_batch`, a loss scaler's `__call__`), or that hands the
optimizer to an object of a library the analysis cannot read (timm's
`loss_scaler(loss, optimizer)` runs both). A loop that reads a DataLoader wins over loops
inside it, which are micro-steps (chunks of the batch); without a DataLoader the innermost
loop that reaches `.backward()` is the step (manual batching, `get_batch()`). Loops around
a step loop, in the same function or in a caller, are epoch loops. Loops that read a
DataLoader and never reach `.backward()` evaluate.

A model *trains* when its parameters reach an optimizer (`SGD(model.parameters())`,
parameter groups, `configure_optimizers()`); a module the step calls that does not train
and takes two arguments or more is a criterion (`FocalLoss()(out, y)`).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from enum import Enum

import libcst as cst

from autoaccel.analysis.names import name_key
from autoaccel.analysis.program import (
    FunctionInfo,
    Kind,
    Obj,
    Program,
    SourceModule,
    argument,
)
from autoaccel.analysis.shapes import bound_names, find, is_name


class LoopRole(Enum):
    TRAIN = "train"
    EVAL = "eval"
    # A loop that fits a model it builds itself (a linear probe on frozen features), on data
    # no DataLoader hands out, beside a training over a DataLoader: every process of a
    # distributed run fits its own, alike, as it evaluates alike.
    FIT = "fit"


@dataclass(eq=False)
class StepLoop:
    """A loop over batches: one iteration is one training or evaluation step."""

    node: cst.For | cst.While
    role: LoopRole
    loader: str | None  # the expression it reads batches from, as written (`self.train_data`)
    batch_names: frozenset[str]  # names bound by the loop target
    module: SourceModule | None = None
    function: FunctionInfo | None = None  # the function holding the loop
    loaders: frozenset[Obj] = frozenset()  # the DataLoaders it reads
    # Functions that call `.backward()` themselves, reached from the loop through calls
    # (`_run_batch`, `train_step`); empty when the loop body calls it.
    step_functions: tuple[FunctionInfo, ...] = ()
    reached: tuple[FunctionInfo, ...] = ()  # every project function its body runs
    micro_loops: tuple[cst.For | cst.While, ...] = ()  # loops over chunks of the batch


@dataclass
class Training:
    """The training structure of a program."""

    step_loops: dict[cst.CSTNode, StepLoop] = field(default_factory=dict)
    epoch_loops: set[cst.CSTNode] = field(default_factory=set)
    micro_loops: set[cst.CSTNode] = field(default_factory=set)
    # Functions that hold a training step loop or call one, directly or through others.
    trainers: set[FunctionInfo] = field(default_factory=set)
    trained: set[Obj] = field(default_factory=set)  # models whose parameters an optimizer updates
    criteria: set[Obj] = field(default_factory=set)  # loss modules, built-in or the project's
    backward_calls: list[cst.Call] = field(default_factory=list)
    # Calls of a library object handed the optimizer inside a loop, which run the
    # backward pass and the update for the loop (`loss_scaler(loss, optimizer)`).
    library_steps: set[cst.Call] = field(default_factory=set)
    # Functions that call `.backward()`, directly or through other functions.
    backpropagating: set[FunctionInfo] = field(default_factory=set)


def find_training(program: Program) -> Training:
    return _Finder(program).find()


class _Finder:
    def __init__(self, program: Program) -> None:
        self.program = program
        self.training = Training()
        # Loops around each call and loop, innermost first, within its function.
        self.around: dict[cst.CSTNode, list[cst.For | cst.While]] = {}
        self.calls_in: dict[cst.CSTNode, list[cst.Call]] = {}  # loop -> calls in its body

    def find(self) -> Training:
        self._nest()
        self.reaching = self.training.backpropagating = self._functions_reaching_backward()
        loops = self.program.loops
        candidates = [loop for loop in loops if self._reaches_backward(loop)]
        readers = {loop: self._loaders_read(loop) for loop in loops}
        loader_steps = [loop for loop in candidates if readers[loop]]
        steps = [
            loop
            for loop in loader_steps
            if not any(self._inside(other, loop) for other in loader_steps if other is not loop)
        ]
        rest = [
            loop
            for loop in candidates
            if loop not in loader_steps
            and not any(self._inside(loop, step) or self._inside(step, loop) for step in steps)
        ]
        steps += [
            loop
            for loop in rest
            if not any(self._inside(other, loop) for other in rest if other is not loop)
        ]
        training = self.training
        for loop in candidates:
            if loop in steps:
                continue
            if any(self._inside(loop, step) for step in steps):
                training.micro_loops.add(loop)
            elif any(self._inside(step, loop) for step in steps):
                training.epoch_loops.add(loop)
        fits = {
            loop
            for loop in steps
            if loader_steps and not readers[loop] and self._fits_own_model(loop)
        }
        for loop in steps:
            self._record(loop, LoopRole.FIT if loop in fits else LoopRole.TRAIN, readers[loop])
        training.trainers = self._with_callers(
            {
                f
                for loop in steps
                if loop not in fits and (f := self.program.function_of[loop]) is not None
            }
        )
        for loop in loops:
            if readers[loop] and loop not in candidates:
                self._record(loop, LoopRole.EVAL, readers[loop])
        self._models()
        return training

    # -- structure -------------------------------------------------------------------
    def _nest(self) -> None:
        """Which loops hold each call and loop of the program (within one function)."""
        program = self.program
        for node in [*program.calls, *program.loops]:
            module = program.module_of[node]
            around = []
            child: cst.CSTNode = node
            for ancestor in module.index.ancestors(node):
                if isinstance(ancestor, (cst.FunctionDef, cst.Lambda, cst.ClassDef)):
                    break
                if isinstance(ancestor, (cst.For, cst.While)) and child is ancestor.body:
                    around.append(ancestor)
                child = ancestor
            self.around[node] = around
            if isinstance(node, cst.Call):
                for loop in around:
                    self.calls_in.setdefault(loop, []).append(node)

    def _functions_reaching_backward(self) -> set[FunctionInfo]:
        program = self.program
        backward = [c for c in program.calls if _is_backward(c)]
        self.training.backward_calls = backward
        self.training.library_steps = {c for c in program.calls if self._is_library_step(c)}
        self.calls_of: dict[FunctionInfo | None, list[cst.Call]] = {}
        for call in program.calls:
            self.calls_of.setdefault(program.function_of[call], []).append(call)
        stepping = [*backward, *self.training.library_steps]
        return self._with_callers({program.function_of[c] for c in stepping} - {None})  # type: ignore[arg-type]

    def _is_library_step(self, call: cst.Call) -> bool:
        """Whether `call`, in a loop, calls an object of a library the analysis cannot
        read and hands it the optimizer (and something else: the loss): a loss scaler
        such as timm's `NativeScaler` runs `backward()` and `optimizer.step()` itself
        (`loss_scaler(loss, optimizer, parameters=model.parameters())`)."""
        if len(call.args) < 2 or not self.around[call]:
            return False
        program = self.program
        module = program.module_of[call]
        callee = program.values_of(call.func, module)
        if not callee or any(obj.kind is not Kind.EXTERNAL for obj in callee):
            return False
        return any(
            any(obj.kind is Kind.OPTIMIZER for obj in program.values_of(arg.value, module))
            or self._annotated_optimizer(arg.value, module)
            for arg in call.args
        )

    def _annotated_optimizer(self, node: cst.BaseExpression, module: SourceModule) -> bool:
        """Whether `node` is a parameter annotated as a `torch.optim` optimizer
        (`optimizer: torch.optim.Optimizer`, built by a library the analysis cannot read)."""
        if not isinstance(node, cst.Name):
            return False
        scope = module.index.scopes.get(node)
        owner = scope.owner(node.value) if scope is not None else None
        function = self.program.function_of_scope(owner) if owner is not None else None
        if function is None:
            return False
        params = function.node.params
        for param in (*params.posonly_params, *params.params, *params.kwonly_params):
            if param.name.value == node.value and param.annotation is not None:
                names = module.index.qualified_names(param.annotation.annotation)
                return any(n.startswith("torch.optim.") for n in names)
        return False

    def _steps(self, call: cst.Call) -> bool:
        """`loss.backward()`, or a library call that runs it (`loss_scaler(loss, optimizer)`)."""
        return _is_backward(call) or call in self.training.library_steps

    def _with_callers(self, functions: set[FunctionInfo]) -> set[FunctionInfo]:
        """`functions` and every project function that calls one of them, directly or
        through others."""
        found = set(functions)
        grew = True
        while grew:
            grew = False
            for function, calls in self.calls_of.items():
                if function is None or function in found:
                    continue
                if any(self.program.callees.get(c, set()) & found for c in calls):
                    found.add(function)
                    grew = True
        return found

    def _reaches_backward(self, loop: cst.CSTNode) -> bool:
        return any(
            self._steps(call) or self.program.callees.get(call, set()) & self.reaching
            for call in self.calls_in.get(loop, ())
        )

    def _reachable(self, loop: cst.CSTNode) -> set[FunctionInfo]:
        """The project functions a call in `loop`'s body runs, directly or indirectly."""
        cache = self.__dict__.setdefault("_reachable_cache", {})
        if loop in cache:
            return cache[loop]
        cache[loop] = found = self.program.reached_by(self.calls_in.get(loop, ()))
        return found

    def _inside(self, inner: cst.CSTNode, outer: cst.CSTNode) -> bool:
        """Whether each run of `outer`'s body may run the loop `inner`."""
        return outer in self.around[inner] or self.program.function_of[inner] in self._reachable(
            outer
        )

    def _fits_own_model(self, loop: cst.For | cst.While) -> bool:
        """Whether each optimizer built in `loop`'s function updates only models built
        there too, and there is one: the loop fits a model of its own, new at each call
        (SimCLR's `train_clf(X, y)`: an L-BFGS linear probe)."""
        program = self.program
        function = program.function_of[loop]
        if function is None:
            return False
        models = [
            program.parameters_of(parameters)
            for optimizer, parameters in optimized_parameters(program)
            if program.function_of.get(optimizer.node) is function
        ]
        return bool(models) and all(
            held and all(program.function_of.get(model.node) is function for model in held)
            for held in models
        )

    def _loaders_read(self, loop: cst.For | cst.While) -> frozenset[Obj]:
        """The DataLoaders `loop` takes its batches from: what it iterates over, or what
        a `next(...)` of its own body (not of an inner loop) draws from."""
        program = self.program
        module = program.module_of[loop]
        sources = [loop.iter] if isinstance(loop, cst.For) else []
        for call in self.calls_in.get(loop, ()):
            if self.around[call][0] is loop and _is_next(call, module):
                sources.append(call.args[0].value)
        return frozenset(
            o
            for source in sources
            for o in program.flat_values_of(source, module)
            if o.kind is Kind.LOADER
        )

    def _record(self, loop: cst.For | cst.While, role: LoopRole, loaders: frozenset[Obj]) -> None:
        program = self.program
        module = program.module_of[loop]
        step_functions: tuple[FunctionInfo, ...] = ()
        reachable = self._reachable(loop)
        # In definition order, as the micro-loops: what steps report must not vary from
        # one run to the next with the objects' hashes.
        reached = tuple(f for f in program.functions.values() if f in reachable)
        if role is LoopRole.TRAIN and not any(self._steps(c) for c in self.calls_in.get(loop, ())):
            step_functions = tuple(
                f for f in reached if any(self._steps(c) for c in self.calls_of.get(f, ()))
            )
        self.training.step_loops[loop] = StepLoop(
            node=loop,
            role=role,
            loader=self._spelling(loop, module),
            batch_names=(
                frozenset(bound_names(loop.target)) if isinstance(loop, cst.For) else frozenset()
            ),
            module=module,
            function=program.function_of[loop],
            loaders=loaders,
            step_functions=step_functions,
            reached=reached,
            micro_loops=tuple(
                m for m in program.loops if m in self.training.micro_loops and self._inside(m, loop)
            ),
        )

    def _spelling(self, loop: cst.For | cst.While, module: SourceModule) -> str | None:
        """The loader as the loop spells it: `loader` of `enumerate(tqdm(loader))`, and of
        `pbar` after `pbar = tqdm(enumerate(loader))`."""
        if isinstance(loop, cst.For):
            iterable = _unwrapped(loop.iter)
            wrapper = self._wrapper_held(iterable, module)
            return name_key(_unwrapped(wrapper) if wrapper is not None else iterable)
        for call in self.calls_in.get(loop, ()):
            if self.around[call][0] is loop and _is_next(call, module):
                return name_key(call.args[0].value)
        return None

    def _wrapper_held(self, node: cst.BaseExpression, module: SourceModule) -> cst.Call | None:
        """The call `node`, a name, is assigned once in its scope, when that call returns
        what its first argument holds (`pbar = tqdm(enumerate(loader))`; not
        `loader = DataLoader(data)`)."""
        if not isinstance(node, cst.Name):
            return None
        index, name = module.index, node.value
        scope = index.scopes[node].owner(name)
        values = [
            assign.value
            for assign in find(module.tree, cst.Assign)
            for target in assign.targets
            if is_name(target.target, name) and index.scopes[target.target].owner(name) is scope
        ]
        if len(values) != 1 or not isinstance(values[0], cst.Call) or not values[0].args:
            return None
        call = values[0]
        held = self.program.values_of(call, module)
        return call if held and held == self.program.values_of(call.args[0].value, module) else None

    # -- what trains -----------------------------------------------------------------
    def _models(self) -> None:
        program, training = self.program, self.training
        for _, obj in optimized_parameters(program):
            training.trained |= program.parameters_of(obj)
        training.criteria = set(program.objects(Kind.CRITERION))
        if not training.trained:
            return  # with nothing known to train, a two-input module may be the model
        for call in self._calls_of_steps():
            module = program.module_of[call]
            positional = [a for a in call.args if a.keyword is None]
            if len(positional) < 2:
                continue
            for obj in program.values_of(call.func, module):
                # a loss of the project's own (`FocalLoss()`), never a library layer
                if obj.kind is Kind.MODULE and obj.cls is not None and not self.trains(obj):
                    training.criteria.add(obj)

    def _calls_of_steps(self) -> Iterator[cst.Call]:
        """The calls a training step makes: in its loop, and in the functions it runs,
        except inside models (a layer called in `forward()` is no criterion)."""
        for step in self.training.step_loops.values():
            if step.role is LoopRole.TRAIN:
                yield from self.calls_in.get(step.node, ())
                for function in self._reachable(step.node):
                    if function.cls is None or not function.cls.is_module:
                        yield from self.calls_of.get(function, ())

    def trains(self, obj: Obj) -> bool:
        return trains(self.training, obj)


def optimized_parameters(program: Program) -> Iterator[tuple[Obj, Obj]]:
    """Each optimizer of the program with each `x.parameters()` object it is given (a list
    of them, `[*a.parameters(), *b.parameters()]`, gives each)."""
    for optimizer in program.objects(Kind.OPTIMIZER):
        params = argument(optimizer.node, 0, "params")  # type: ignore[arg-type]
        if params is None:
            continue
        for obj in program.flat_values_of(params, optimizer.module):
            if obj.kind is Kind.PARAMETERS:
                yield optimizer, obj


def trains(training: Training, obj: Obj) -> bool:
    """Whether `obj` (a model) is updated by an optimizer: it, or its class as a whole
    (an optimizer built in a method of the class from `self.parameters()`)."""
    return obj in training.trained or any(
        t.cls is obj.cls and t.node is (obj.cls.node if obj.cls else None) for t in training.trained
    )


def _is_backward(call: cst.Call) -> bool:
    func = call.func
    return isinstance(func, cst.Attribute) and func.attr.value == "backward"


def _unwrapped(iterable: cst.BaseExpression) -> cst.BaseExpression:
    """`iterable` less the calls around it: `loader` of `enumerate(tqdm(loader))`."""
    while isinstance(iterable, cst.Call) and iterable.args:
        iterable = iterable.args[0].value
    return iterable


def _is_next(call: cst.Call, module: SourceModule) -> bool:
    return (
        bool(call.args)
        and isinstance(call.func, cst.Name)
        and "builtins.next" in module.index.qualified_names(call.func)
    )
