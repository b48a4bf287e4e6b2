"""What every `--to ddp` step shares: the names of the set-up block, statement insertion,
imports, and where a script's scopes, training functions and models are."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property, partial
from pathlib import Path

import libcst as cst
import libcst.matchers as m

from autoaccel.analysis.index import ModuleIndex, descendants
from autoaccel.analysis.names import name_key
from autoaccel.analysis.positions import Positions
from autoaccel.analysis.program import FunctionInfo, Kind, Obj, Program, SourceModule, Values
from autoaccel.analysis.script_model import (
    DISTRIBUTED_DATA_PARALLEL,
    DISTRIBUTED_SAMPLER,
    LoopRole,
)
from autoaccel.analysis.shapes import (
    called_function,
    find,
    is_method_call,
    is_name,
    is_no_grad_block,
)
from autoaccel.analysis.side_effects import (
    FILE_HANDLERS,
    SUMMARY_WRITERS,
    find_side_effects,
    function_writes,
)
from autoaccel.analysis.training import StepLoop, Training
from autoaccel.convert.transform import StatementRewrite, same_nodes
from autoaccel.convert.transforms.inserted_names import fresh_name  # noqa: F401 - the steps' import
from autoaccel.cst_edit import add_import, add_imports, keyword_value
from autoaccel.facts.resolve import FactsResolver

# Module-level names the set-up block defines; every later step builds on them.
DISTRIBUTED = "DISTRIBUTED"
RANK = "RANK"
LOCAL_RANK = "LOCAL_RANK"
WORLD_SIZE = "WORLD_SIZE"

DIST_IMPORT = "import torch.distributed as dist"
MANUAL_SEED = "torch.manual_seed"
INIT_PROCESS_GROUP = frozenset(
    {
        "torch.distributed.init_process_group",
        "torch.distributed.distributed_c10d.init_process_group",
    }
)
# Context managers under which a forward pass records no graph (nothing to train).

Statements = list[cst.BaseStatement]
Scope = cst.FunctionDef | None  # None: module level


def parse_statements(code: str) -> Statements:
    """Statements of `code`, with their comments and blank lines."""
    module = cst.parse_module(code)
    body = list(module.body)
    if body and module.header:
        header = [
            line.with_changes(indent=False) if line.comment is None else line
            for line in module.header
        ]
        body[0] = body[0].with_changes(leading_lines=[*header, *body[0].leading_lines])
    return body


def has_setup_block(module: cst.Module) -> bool:
    """Whether the module has the set-up block: `DISTRIBUTED = "LOCAL_RANK" in os.environ`
    at top level (a `DISTRIBUTED` of the script's own is not one)."""
    setup = m.Assign(
        targets=[m.AssignTarget(m.Name(DISTRIBUTED))],
        value=m.Comparison(left=m.SimpleString('"LOCAL_RANK"')),
    )
    return any(m.matches(s, m.SimpleStatementLine(body=[setup])) for s in module.body)


def setup_block_end(module: cst.Module) -> cst.BaseStatement:
    """The last statement of the set-up block: its `if DISTRIBUTED:`, or in a module
    that only reads the environment (one the script imports), `WORLD_SIZE = ...`."""
    last = m.SimpleStatementLine(body=[m.Assign(targets=[m.AssignTarget(m.Name(WORLD_SIZE))])])
    ends = [s for s in module.body if m.matches(s, m.If(test=m.Name(DISTRIBUTED)) | last)]
    return next((s for s in ends if isinstance(s, cst.If)), ends[-1])


def rank_zero(statements: Statements) -> cst.If:
    """`if RANK == 0:` around `statements`; the first one's comments go above the `if`."""
    leading = statements[0].leading_lines
    body = [statements[0].with_changes(leading_lines=[])] + [
        s.with_changes(
            leading_lines=[
                line.with_changes(indent=False) if line.comment is None else line
                for line in s.leading_lines
            ]
        )
        for s in statements[1:]
    ]
    guard = cst.ensure_type(cst.parse_statement(f"if {RANK} == 0:\n    pass\n"), cst.If)
    return guard.with_changes(body=cst.IndentedBlock(body=body), leading_lines=leading)


def number_over_processes(name: str, doc: str, averaged: bool) -> str:
    """The code of `name(value)`: a Python number each process computed, summed over the
    processes with an all-reduce (and divided by their number when `averaged`); the value
    itself under plain `python`. `doc` is its docstring."""
    divided = f" / {WORLD_SIZE}" if averaged else ""
    return f'''
def {name}(value):
    """{doc}"""
    if not {DISTRIBUTED}:
        return value
    total = torch.tensor(float(value), dtype=torch.float64)
    dist.all_reduce(total)
    return total.item(){divided}
'''


def where(module: SourceModule, node: cst.CSTNode) -> str:
    """`utils_io.py:7`: where `node` of `module` is."""
    line = Positions(module.tree)[node].start.line
    return f"{Path(module.path or module.name).name}:{line}"


def sole_callee(program: Program | None, call: cst.Call) -> FunctionInfo | None:
    """The function of the project that `call` runs, if it runs one alone."""
    callees = program.callees.get(call, ()) if program is not None else ()
    return next(iter(callees)) if len(callees) == 1 else None


def callee_in(
    program: Program | None, module: SourceModule, call: cst.Call
) -> cst.FunctionDef | None:
    """The function of `module` that `call` runs, if it runs one alone."""
    function = sole_callee(program, call)
    return function.node if function is not None and function.module is module else None


def runs_a_call(
    program: Program | None,
    call: cst.Call,
    found: Callable[[cst.Call, SourceModule], bool],
) -> bool:
    """Whether `call` runs a function of the project with a call that is `found` (given
    the call and its module), itself or through the functions it calls."""
    seen: set[cst.FunctionDef] = set()
    calls = [call]
    while calls:
        for function in program.callees.get(calls.pop(), ()) if program is not None else ():
            if function.node in seen:
                continue
            seen.add(function.node)
            inner = find(function.node, cst.Call)
            if any(found(c, function.module) for c in inner):
                return True
            calls.extend(inner)
    return False


def runs_save(program: Program | None, call: cst.Call) -> bool:
    """Whether `call` runs a function of the project that calls `torch.save`, itself or
    through the functions it calls (`early_stopping(val_loss, model, path)`)."""
    return runs_a_call(
        program, call, lambda c, module: "torch.save" in module.index.qualified_names(c.func)
    )


def _saves_among_other_work(program: Program | None, call: cst.Call) -> bool:
    """Whether `call` runs a method of a class of the project that saves a checkpoint
    (`runs_save`) besides doing other work (a helper function is guarded or refused where
    it is called, `guard_rank_zero.py`): `early_stopping(val_loss, model, path)`, whose
    `EarlyStopping.__call__` counts the epochs without progress and, on progress, calls
    its `save_checkpoint()`. A guard of the call would skip that work on the other ranks:
    its module is converted, the save guarded where it is."""
    helper = sole_callee(program, call)
    if helper is None or helper.cls is None or not runs_save(program, call):
        return False
    module = helper.module
    by_function = function_writes(module.tree, module.index, partial(callee_in, program, module))
    writes = by_function.get(helper.node)
    return writes is None or not writes.only


def converted_modules(
    program: Program | None, training: Training, target: str | None = None
) -> set[SourceModule]:
    """The modules of the project a conversion to `target` rewrites: those the distributed
    changes go into (`distributed_modules`) and those of the step functions the training
    loops call (their forward gets autocast)."""
    steps = [s for s in training.step_loops.values() if s.role is LoopRole.TRAIN]
    functions = {f.module for s in steps for f in s.step_functions}
    return distributed_modules(program, training, target) | functions


def distributed_modules(
    program: Program | None, training: Training, target: str | None = None
) -> set[SourceModule]:
    """The modules of the project the distributed changes go into: where the training
    step loops are and the loaders they read, and the modules of the checkpointing
    helpers they call (`_saves_among_other_work`), whose saves go on rank 0. Under `--to
    fsdp` not those of a helper given a trained model: every process must gather its
    state dict before rank 0 saves it, so the call is refused where it is
    (`GuardRankZeroGathering`). `target` None: what any target may change."""
    steps = [s for s in training.step_loops.values() if s.role is LoopRole.TRAIN]
    loop_modules = {s.module for s in steps if s.module is not None}
    return (
        loop_modules
        | {o.module for s in steps for o in s.loaders}
        | {
            helper.module
            for module in loop_modules
            for call in find(module.tree, cst.Call)
            if (helper := sole_callee(program, call)) is not None
            and helper.module not in loop_modules
            and _saves_among_other_work(program, call)
            and not (target == "fsdp" and _given_trained_model(program, training, call, module))
        }
        | {
            helper.module
            for module in loop_modules
            for call in find(module.tree, cst.Call)
            if (helper := sole_callee(program, call)) is not None and _makes_a_log_writer(helper)
        }
        | {
            helper.module
            for module in loop_modules
            for call in find(module.tree, cst.Call)
            if target in (None, "fsdp")
            and (helper := sole_callee(program, call)) is not None
            and helper.module not in loop_modules
            and _loads_a_state_dict(helper)
            and _given_trained_model(program, training, call, module)
        }
    )


def _loads_a_state_dict(function: FunctionInfo) -> bool:
    """Whether `function` calls `.load_state_dict(...)`: CIFAR-ZOO's `load_checkpoint(path,
    net, optimizer)` loads into the model it is given, which under FSDP must take the
    whole state dict through `load_full_state_dict` in that module."""
    return any(is_method_call(c, "load_state_dict") for c in find(function.node, cst.Call))


def _makes_a_log_writer(function: FunctionInfo) -> bool:
    """Whether `function` makes a TensorBoard writer or a `logging` file handler (cs230's
    `utils.set_logger(path)`): its module gets the change that makes it on rank 0 only."""
    index = function.module.index
    return any(
        index.qualified_names(call.func) & (SUMMARY_WRITERS | FILE_HANDLERS)
        for call in find(function.node, cst.Call)
    )


def _given_trained_model(
    program: Program | None, training: Training, call: cst.Call, module: SourceModule
) -> bool:
    """Whether an argument of `call` may hold a model the training updates."""
    return program is not None and any(
        not program.flat_values_of(arg.value, module).isdisjoint(training.trained)
        for arg in call.args
    )


@dataclass(frozen=True)
class TrainedModel:
    """A model that a training loop calls, and where it is ready to be wrapped."""

    key: str  # `model`, `self.net`
    block: cst.IndentedBlock | cst.Module  # the scope's block that builds it
    anchor: cst.BaseStatement  # the last statement there that builds or moves it
    training: cst.BaseStatement | None  # the first statement there that trains


@dataclass(frozen=True)
class PassedModel:
    """A trained model that the training code of this module passes to a function of
    another module of the project, which calls it: `mylib.train_step(model, opt, x, y)`,
    whose `model(x)` the run showed training it (`DistributedStep.passed_models`)."""

    key: str  # the name passed here: `model`
    arg: cst.Arg  # the argument that passes it, in this module
    function: FunctionInfo  # the function it is passed to, in its own module
    param: str  # the function's parameter that receives it


MAIN_TEST = m.Comparison(left=m.Name("__name__"))


class DistributedStep(StatementRewrite):
    """A `--to ddp` step: acts only on scripts that carry the set-up block, and edits
    by inserting or replacing whole statements (`self.before`, `self.after`,
    `self.replace`, keyed by original statements)."""

    code = "ddp"
    # A step for the script that runs only, never for a module it imports.
    entry_only: bool = False

    def transform_module(self, tree: cst.Module) -> cst.Module:
        if not has_setup_block(tree) or (self.entry_only and not self.in_entry_script):
            return tree
        return super().transform_module(tree)

    def transform_module_impl(self, tree: cst.Module) -> cst.Module:
        self.before: dict[cst.CSTNode, Statements] = {}
        self.after: dict[cst.CSTNode, Statements] = {}
        self.replace: dict[cst.CSTNode, Statements] = {}
        self.imports: list[str] = []
        # inserted code reads `torch.` (`shard_model()`, `MethodAsForward`): `import torch`
        # where the module does not bind `torch` yet (a helper module may import `torch.nn
        # as nn` alone)
        self.needs_torch = False
        return super().transform_module_impl(tree)

    def run_facts(self) -> FactsResolver | None:
        """The facts of a short run of the script for this module's tree: the script's, or
        another module's of its project (a model may be built, trained and called in any
        of them: the loop of `train_eval.py` trains the model its caller built)."""
        return self.module_facts()

    def planned_statements(self) -> list[cst.CSTNode]:
        """The statements `rebuild` inserts around or replaces (for `edited`)."""
        return [*self.before, *self.after, *self.replace]

    # -- edits ------------------------------------------------------------------------
    def rebuild(self, originals: Statements, updated: Statements) -> Statements:
        if len(originals) != len(updated):
            return updated
        result: Statements = []
        for original, new in zip(originals, updated):
            unit = [*self.before.get(original, []), *self.replace.get(original, [new])]
            if unit and unit[0] is not new and new in unit:
                # the first statement of the unit carries the comments above it, then its own
                unit[0] = unit[0].with_changes(
                    leading_lines=[*new.leading_lines, *unit[0].leading_lines]
                )
                unit[unit.index(new)] = new.with_changes(leading_lines=[])
            result += unit + self.after.get(original, [])
        return result

    def leave_Module(self, original_node: cst.Module, updated_node: cst.Module) -> cst.Module:
        body = self.rebuild(list(original_node.body), list(updated_node.body))
        if same_nodes(body, updated_node.body) and not self.imports and not self.needs_torch:
            return updated_node  # nothing to do: the tree is passed on as it is
        module = updated_node.with_changes(body=_space_new_definitions(body, updated_node.body))
        for statement in self.imports:
            module = add_import(module, statement)
        return add_imports(module, ("torch",)) if self.needs_torch else module

    def define_helper(self, module: cst.Module, name: str, code: str) -> None:
        """Define the function or class `name` (its `code`) after the set-up block, unless
        the module defines or binds that name already."""
        bound = {name_key(t.target) for t in find(module, cst.AssignTarget)}
        if name in bound or any(
            d.name.value == name for d in find(module, (cst.FunctionDef, cst.ClassDef))
        ):
            return
        self.after.setdefault(setup_block_end(module), []).extend(
            parse_statements("\n\n" + code.lstrip("\n"))
        )

    def seed_calls(
        self, module: cst.Module, seeds: frozenset[str] = frozenset({MANUAL_SEED})
    ) -> list[cst.Call]:
        """The calls that seed a global generator (`seeds`, torch's by default):
        `torch.manual_seed(...)`, or a call of a function of the project that calls it
        (`set_seed(config.seed)` of a utils module)."""
        program = self.script.program
        return [
            call
            for call in find(module, cst.Call)
            if self.qualified_names(call.func) & seeds
            or program is not None
            and any(
                function.module.index.qualified_names(inner.func) & seeds
                for function in program.callees.get(call, ())
                for inner in find(function.node.body, cst.Call)
            )
        ]

    # -- where things are -------------------------------------------------------------
    def scope_of(self, node: cst.CSTNode) -> Scope:
        return next((a for a in self.ancestors(node) if isinstance(a, cst.FunctionDef)), None)

    def _factory(self, function: Scope, key: str, training: set[str], loops: set) -> bool:
        """Whether `function` returns what its name `key` holds (alone or in a tuple)
        without training it (a `main()` that trains, then returns the model, is none)."""
        if function is None or _trains_in(function.body, training, loops):
            return False
        returned = [r.value for r in find(function, cst.Return) if r.value]
        values = [e.value for v in returned if isinstance(v, cst.Tuple) for e in v.elements]
        return any(name_key(v) == key for v in returned + values)

    def statement_of(self, node: cst.CSTNode) -> cst.BaseStatement:
        """The statement of a block (module, function, loop body) that holds `node`."""
        child = node
        for ancestor in self.ancestors(node):
            if isinstance(ancestor, (cst.IndentedBlock, cst.Module)):
                return child  # type: ignore[return-value]
            child = ancestor
        raise ValueError("node outside a module")

    def train_loops(self) -> list[cst.For | cst.While]:
        return [step.node for step in self._train_steps]

    @cached_property
    def _train_steps(self) -> list[StepLoop]:
        """The training step loops of this module that the program runs: a loop in a
        function nothing calls is another entry point's (left as it is)."""
        return [
            step for step in self.script.step_loops.values()
            if step.role is LoopRole.TRAIN and uncalled_function(step, self.script.program) is None
        ]  # fmt: skip

    def train_code(self) -> list[cst.CSTNode]:
        """Where training steps run in this module: the training step loops and the
        functions they call (`train_step()`, a Trainer's `_run_batch`), models' own
        methods (`forward`) excepted."""
        code: list[cst.CSTNode] = []
        for step in self._train_steps:
            code.append(step.node)
            code += [
                function.node
                for function in step.reached
                if function.module is step.module and not (function.cls and function.cls.is_module)
            ]
        return list(dict.fromkeys(code))

    def divides_training_sum(self, node: cst.CSTNode) -> bool:
        """Whether `node` is a factor of the divisor in an average of a training sum:
        `running_loss / (batch_size * i)`, `100 * correct / len(train_set)`, where the
        dividend reads a name that a training step loop adds to (`running_loss += ...`).
        Under DDP that sum covers this process's shard, so the divisor must count the
        shard too."""
        child = node
        for ancestor in self.ancestors(node):
            if not isinstance(ancestor, cst.BinaryOperation):
                return False
            if isinstance(ancestor.operator, cst.Divide) and ancestor.right is child:
                summed = {name_key(read) for read in find(ancestor.left, (cst.Name, cst.Attribute))}
                return bool(summed & self._training_sums)
            if not isinstance(ancestor.operator, cst.Multiply):
                return False
            child = ancestor
        return False

    @cached_property
    def _training_sums(self) -> set[str]:
        """Names a training step loop adds to with `+=` (once per pass: asked for each
        divisor of a print)."""
        sums = (
            name_key(update.target)
            for loop in self.train_loops()
            for update in find(loop, cst.AugAssign)
            if isinstance(update.operator, cst.AddAssign)
        )
        return {name for name in sums if name is not None}

    def training_functions(self, module: cst.Module) -> set[str]:
        """Names of the functions that train: they hold a training step loop or call one
        that does (methods by their bare name)."""
        names: set[str] = set()
        for loop in self.train_loops():
            scope = self.scope_of(loop)
            if scope is not None:
                names.add(scope.name.value)
        functions = find(module, cst.FunctionDef)
        grew = True
        while grew:
            grew = False
            for function in functions:
                if function.name.value not in names and called_function(function.body, names):
                    names.add(function.name.value)
                    grew = True
        return names

    def shards(
        self, module: cst.Module, loader: cst.Call, index: ModuleIndex | None = None
    ) -> bool:
        """Whether a DataLoader call of `module` (whose index is `index`, default this
        module's) reads through a DistributedSampler: `sampler=name` bound to one, or
        `**kwargs` whose `kwargs["sampler"]` is set to one."""
        index = index or self.script.index
        assert index is not None
        sampler = keyword_value(loader, "sampler")
        names = {name_key(sampler)} if sampler is not None else set()
        names |= {f"{name_key(a.value)}[sampler]" for a in loader.args if a.star == "**"}
        for assign in find(module, cst.Assign):
            targets = {_target_name(t.target) for t in assign.targets}
            if targets & names and any(
                DISTRIBUTED_SAMPLER in index.qualified_names(c.func)
                for c in find(assign.value, cst.Call)
            ):
                return True
        return False

    def shards_loader(self, loader: Obj) -> bool:
        """`shards` for a DataLoader built in any module of the program."""
        module = loader.module
        return self.shards(module.tree, loader.node, module.index)  # type: ignore[arg-type]

    def ddp_wrappers(self, module: cst.Module) -> set[str]:
        """Names that hold a DDP wrapper: assigned one, or a parameter of a function
        that some call passes one to."""
        names = {
            name_key(target.target)
            for call in find(module, cst.Call)
            if DISTRIBUTED_DATA_PARALLEL in self.qualified_names(call.func)
            for assign in self.ancestors(call)
            if isinstance(assign, cst.Assign)  # the statement the call is in, if any
            for target in assign.targets
        }
        calls_by_name: dict[str, list[cst.Call]] = {}  # calls of plain names: `train(...)`
        for call in find(module, cst.Call):
            if isinstance(call.func, cst.Name):
                calls_by_name.setdefault(call.func.value, []).append(call)
        for function in find(module, cst.FunctionDef):
            params = [p.name.value for p in function.params.params]
            for call in calls_by_name.get(function.name.value, []):
                positional = [a for a in call.args if a.keyword is None and not a.star]
                names |= {p for p, a in zip(params, positional) if name_key(a.value) in names}
        return {n for n in names if n is not None}

    def under_no_grad(self, node: cst.CSTNode) -> bool:
        """Whether `node` runs inside a `with torch.no_grad():` (or `inference_mode()`)."""
        return any(is_no_grad_block(a, self.qualified_names) for a in self.ancestors(node))

    def scope_block(self, node: cst.CSTNode) -> cst.IndentedBlock | cst.Module:
        """The block of the scope `node` runs in: a function body, the body of
        `if __name__ == "__main__":`, or the module; or the body of a `try:` in them that
        holds a training loop besides (DDPM's `try:` around building and training, with
        an `except KeyboardInterrupt:` that saves)."""
        for ancestor in self.ancestors(node):
            if isinstance(ancestor, cst.Module):
                return ancestor
            owner = self.parent(ancestor) if isinstance(ancestor, cst.IndentedBlock) else None
            if (
                isinstance(owner, cst.FunctionDef)
                or (isinstance(owner, cst.If) and m.matches(owner.test, MAIN_TEST))
                or (isinstance(owner, cst.Try) and self._trains_within(ancestor))
            ):
                return ancestor  # type: ignore[return-value]
        raise ValueError("node outside a module")

    def _trains_within(self, block: cst.CSTNode) -> bool:
        """Whether a training step loop of this module lies in `block`."""
        return any(block in self.ancestors(loop) for loop in self.train_loops())

    def step_calls(self, module: cst.Module) -> list[cst.Call]:
        """The calls of the training code that every process runs: those of a function
        that only writes (PyTorch-GAN's `sample_image()` runs the generator to save a
        grid) are left out, since only rank 0 will run it."""
        writers = find_side_effects(module, self.script.index).writer_functions
        return [
            call
            for code in self.train_code()
            for call in find(code, cst.Call)
            if self.scope_of(call) not in writers
        ]

    def trained_models(self, module: cst.Module) -> list[TrainedModel]:
        """Models called in a training step loop, each with the statement after which it
        is built and on its device (before the first statement that trains)."""
        # What the step loops call under each model name, where the analysis knows it
        called: dict[str, set[Obj]] = {}
        self.passed_models: dict[str, list[PassedModel]] = {}
        self.trained_methods: dict[str, list[cst.Call]] = {}
        for call in self.step_calls(module):
            if (key := name_key(call.func)) in self.script.models:
                known = {o for o in self.script.values(call.func) if o.kind is Kind.MODULE}
                called.setdefault(key, set()).update(known)
        wrappers = self.ddp_wrappers(module)
        if not called.keys() - wrappers:
            called.update(self._called_per_run_facts(module))
        if not called and self.run_facts() is None:  # (a wrapper's calls: converted before)
            called.update(self._called_through_methods(module))
        keys = sorted(called.keys() - wrappers)
        training = self.training_functions(module)
        loops = set(self.train_loops())
        assignments: list[cst.Assign | cst.AnnAssign] = find(module, (cst.Assign, cst.AnnAssign))

        def assigned(key: str) -> list[cst.CSTNode]:
            """The assignments of `key`, those known to bind the model the loops call
            first (not another variable of that name: `model = self.fc(x)` in a
            `forward()` that comes before the script's `model = Net()`), and of those the
            ones whose value is that model (`self.unet = UNet()` in `build_model()`, not
            the placeholder `self.unet = None` of `__init__`: the attribute holds both)."""
            found = [a for a in assignments if any(_binds_model(t, key) for t in _targets(a))]
            held = called.get(key)
            if held:
                found.sort(
                    key=lambda a: (
                        held.isdisjoint(self._bound_values(a)),
                        a.value is None or held.isdisjoint(self.script.flat_values(a.value)),
                        # a factory's (`set_model()` returns it): its caller holds it
                        self._factory(self.scope_of(a), key, training, loops),
                    )
                )
            return found

        found = []
        for key in keys:
            assigns = assigned(key)
            receiver = None if assigns else self._receiving_function(key) or self._loop_method(key)
            if receiver is None and not assigns:
                continue
            model = self._ready(key, self.scope_block(assigns[0]) if assigns else receiver.body, receiver is not None, training, loops)  # type: ignore[union-attr]
            if model is None and receiver is not None:
                # A step function that receives the model (`def train_iter(model, ...)`
                # called as `train_iter(gcn, ...)` in the loop): the model is ready where
                # the caller builds it, under its own name.
                builders = sorted(
                    alias
                    for alias in self.script.names_of(self.script.held_by(key)) - {key}
                    if assigned(alias)
                )
                if len(builders) == 1:
                    alias = builders[0]
                    block = self.scope_block(assigned(alias)[0])
                    model = self._ready(alias, block, False, training, loops)
            if model is not None:
                found.append(model)
        return found

    # -- facts from a run of the script (`autoaccel.facts`) -----------------------------
    def _called_per_run_facts(self, module: cst.Module) -> dict[str, set[Obj]]:
        """Where the static model found no trained model, the models the run trained
        (the modules whose parameters a stepping optimizer holds), under the names the
        training code calls them by: `self.model(x)` where the run called that model at
        that node, or `model` passed to `mylib.train_step(model, ...)` whose `model(x)`
        in mylib.py ran it (those go to `self.passed_models`, for the wrap step to pass
        the wrapper instead). A name the static model binds to another construction call
        of this module than the one that made the model in the run is left out, and both
        views are reported (refused). A trained model the run did not call, which the
        training code runs through a method of its class (`self.policy.evaluate(s, a)`),
        is found under its name, the calls going to `self.trained_methods`; one neither
        called nor reached that way is refused (the wrap step could not reach it), unless
        it is made and trained in another module of the project."""
        facts = self.run_facts()
        if facts is None or not facts.trained_models():
            return {}
        called: dict[str, set[Obj]] = {}
        reached: set[int] = set()
        # (`models["net"]`: `fully_shard` checks the model's reads by its name, not by an item)
        items = self.options.target != "fsdp"
        for call in self.step_calls(module):
            models = facts.trained_at(call)
            key = model_key(call.func) if items else name_key(call.func)
            if not models or key is None:
                continue
            reached |= {model.id for model in models}
            if not self._agrees(facts, key, models, call, module):
                continue
            called.setdefault(key, set()).update(self._static_models(call))
        for passed, models in self._passed_per_run_facts(module, facts):
            reached |= {model.id for model in models}
            if not self._agrees(facts, passed.key, models, passed.arg, module):
                continue
            called.setdefault(passed.key, set()).update(self._static_models(passed.arg))
            self.passed_models.setdefault(passed.key, []).append(passed)
        missed = [model for model in facts.trained_models() if model.id not in reached]
        methods = self._method_calls_of(module, facts, missed) if missed and not called else []
        for method in methods:
            owner = name_key(method.func.value)  # type: ignore[attr-defined]
            if owner is None:
                self._facts_refuse(
                    f"the run shows the optimizer trains {self._facts_made(facts, missed)}, which"
                    f" the training step runs through `{_code(method.func)}()`, not through its"
                    " forward(), on a model the conversion cannot name (an item of a container):"
                    " a DDP or FSDP wrapper averages gradients (or gathers parameters) only in a"
                    " forward() called through it; bind the model to a name, then convert again",
                    method,
                )
            else:  # (`_method_calls_of`: the static model binds it to the run's model)
                called.setdefault(owner, set()).update(self._static_models(method.func.value))  # type: ignore[attr-defined]
                self.trained_methods.setdefault(owner, []).append(method)
        if missed and not called and not methods and not self._trained_elsewhere(facts, missed):
            where = [f for model in missed for f in facts.facts.forwards_of(model.id)]
            calls = "; ".join(
                f"`{facts.text_of(f.site) or '?'}` at {facts.shown(f.site)}" for f in where[:3]
            )
            self._facts_refuse(
                f"the run shows the optimizer trains {self._facts_made(facts, missed)}"
                f"{', called as ' + calls if calls else ', never called at top level'}, which the"
                " training code of this file does not call by a name the conversion can wrap"
                f" ({'' if items else 'under --to fsdp, '}an item of a container, a model passed"
                " to another module); wrap it by hand",
                None,
            )
        return called

    def _method_calls_of(
        self, module: cst.Module, facts: FactsResolver, models: list
    ) -> list[cst.Call]:
        """The calls of the training code of a method of one of `models` (trained in the
        run, never called), outside `torch.no_grad()`: `self.policy.evaluate(s, a)` of a
        PPO agent."""
        made = {facts.creation_call(model) for model in models} - {None}
        return [
            call for call in self._method_calls(module)
            if made & {o.node for o in self.script.values(call.func.value) if o.kind is Kind.MODULE}  # type: ignore[attr-defined]
        ]  # fmt: skip

    def _called_through_methods(self, module: cst.Module) -> dict[str, set[Obj]]:
        """Without a run (a module the script imports, or `--no-run`): the models an
        optimizer trains that the training code runs only through a method their class
        defines (`self.policy.evaluate(s, a)`), by name; the calls go to
        `self.trained_methods`."""
        called: dict[str, set[Obj]] = {}
        for call in self._method_calls(module):
            owner = name_key(call.func.value)  # type: ignore[attr-defined]
            trained = {
                o for o in self.script.values(call.func.value)  # type: ignore[attr-defined]
                if o.kind is Kind.MODULE and self.script.trains(o)
            }  # fmt: skip
            if owner is not None and trained:
                called.setdefault(owner, set()).update(trained)
                self.trained_methods.setdefault(owner, []).append(call)
        return called

    def _method_calls(self, module: cst.Module) -> list[cst.Call]:
        """The calls of the training code of a method that a model's class defines (not
        `forward`, nor one of `nn.Module`), outside `torch.no_grad()`: an inference there
        needs no gradient."""
        return [
            call for call in self.step_calls(module)
            if self.script.model_method(call) and not self.under_no_grad(call)
        ]  # fmt: skip

    def _trained_elsewhere(self, facts: FactsResolver, models: list) -> bool:  # list[Made]
        """Whether other files of the project train `models`, whose modules then wrap (or
        refuse) them, while this module has no training step loop: the run called each
        only there (run.py builds the model that `train()` of train_eval.py calls), or
        each is made there (PPO-PyTorch's `train.py` calls `ppo_agent.update()` of PPO.py).
        A module whose loop trains them through another file's method (an agent's
        `train()`) answers for them itself."""

        def elsewhere(site) -> bool:  # (site: Site | None)
            return site is not None and Path(site.path).resolve() != Path(facts.path)

        def called_elsewhere(model) -> bool:  # (model: Made)
            forwards = facts.facts.forwards_of(model.id)
            return bool(forwards) and all(elsewhere(f.site) for f in forwards)

        return not self._train_steps and all(
            called_elsewhere(model) or elsewhere(model.site) for model in models
        )

    def _agrees(
        self, facts: FactsResolver, key: str, models: list, node: cst.CSTNode, module: cst.Module
    ) -> bool:  # models: list[Made]
        """Whether the static model binds `key` (called, or passed on, at `node`) to the
        construction calls that made `models` in the run, or to none of this module; if
        not, both views are reported (refused)."""
        made = [facts.creation_call(model) for model in models]
        nodes = {o.node for o in self._static_models(node) if o.module.tree is module}
        if not nodes or all(call is None or call in nodes for call in made):
            return True
        seen = ", ".join(sorted(f"`{_code(n)}` at line {self.line_of(n)}" for n in nodes))
        self._facts_refuse(
            f"`{key}` holds {seen} to the static analysis, while the run shows"
            f" {self._facts_made(facts, models)}, called here; nothing is wrapped on"
            " either view: wrap the trained model by hand",
            node,
        )
        return False

    def _static_models(self, node: cst.CSTNode) -> set[Obj]:
        """The modules the static model says the call or argument `node` names."""
        return {o for o in self.script.values(_named(node)) if o.kind is Kind.MODULE}

    def _passed_per_run_facts(
        self, module: cst.Module, facts: FactsResolver
    ) -> list[tuple[PassedModel, list]]:  # list[Made]
        """The models the training code passes by name to a function of another module of
        the project that calls them, where the run trained them (the static program links
        the call to the function and its parameter; the run's forwards, recorded in that
        module, say that the parameter's calls ran a trained model)."""
        given = self.step_context.facts
        assert given is not None  # `facts` resolves them
        found = []
        for call in self.step_calls(module):
            for function in self.script.callees(call):
                path = function.module.path
                method_of_a_model = function.cls is not None and function.cls.is_module
                if function.module.tree is module or path is None or method_of_a_model:
                    continue
                elsewhere = given.resolver_in(path, function.module.tree)
                for arg, param in passed_args(call, function):
                    key = name_key(arg.value)
                    forwards = [
                        c for c in find(function.node.body, cst.Call) if is_name(c.func, param)
                    ]
                    ran = {model.id: model for c in forwards for model in elsewhere.trained_at(c)}
                    models = list(ran.values())
                    if key is not None and models:
                        found.append((PassedModel(key, arg, function, param), models))
        return found

    def _facts_made(self, facts: FactsResolver, models: list) -> str:  # list[Made]
        """`Net()` made at train.py:12:9, for each of `models`."""
        return " and ".join(
            f"`{facts.text_of(model.site) if model.site and facts.node_at(model.site) else model.cls.rpartition('.')[2]}`"
            f" made at {facts.shown(model.site)}"
            for model in models
        )

    def _facts_refuse(self, reason: str, node: cst.CSTNode | None) -> None:
        """Log `reason` once per conversion (several steps ask for the trained models)."""
        what = "facts from the run"
        if any(s.what == what and s.reason == reason for s in self.log.skipped):
            return
        self.skipped(what, reason, node, wrong=True)

    def _bound_values(self, assignment: cst.Assign | cst.AnnAssign) -> Values:
        """What the assignment binds, where it has one target and one value (unpacked:
        `model, criterion = set_model()` binds both)."""
        targets = assignment.targets if isinstance(assignment, cst.Assign) else [assignment]
        if len(targets) != 1 or assignment.value is None:
            return frozenset()
        return self.script.flat_values(targets[0].target) | self.script.flat_values(
            assignment.value
        )

    def _ready(
        self,
        key: str,
        block: cst.IndentedBlock | cst.Module,
        received: bool,
        training: set[str],
        loops: set,
    ) -> TrainedModel | None:
        """Where in `block` the model `key` is ready, before the first statement that
        trains (None when it is not: no statement builds it there, or a model the block's
        function `received` is not trained there, since the function is a step itself)."""
        anchor = trains = None
        for statement in block.body:
            if isinstance(statement, (cst.FunctionDef, cst.ClassDef)):
                continue
            if _trains_in(statement, training, loops):
                trains = statement
                break
            if builds(statement, key) or received:
                anchor = statement  # a model received ready: wrapped just before training
        if anchor is None or (received and trains is None):
            return None
        return TrainedModel(key, block, anchor, trains)

    def _loop_method(self, key: str) -> cst.FunctionDef | None:
        """The method that holds a training step loop, for a model that the training code
        calls as `key`, an attribute of `self` this module never assigns (a base class of
        another module does: `self.model = self._build_model().to(self.device)`): the
        model is ready when the method starts, and wrapped there as one it receives."""
        if not key.startswith("self."):
            return None
        scopes = (self.scope_of(loop) for loop in self.train_loops())
        methods = (f for f in scopes if f is not None and f.params.params[:1])
        return next((f for f in methods if f.params.params[0].name.value == "self"), None)

    def _receiving_function(self, key: str) -> cst.FunctionDef | None:
        """The function that trains a model it receives as its parameter `key` (the model
        is built in another module, a `fit(model, ...)` of a library of the project)."""
        for code in self.train_code():
            for call in find(code, cst.Call):
                function = self.scope_of(call) if name_key(call.func) == key else None
                if (
                    function is not None
                    and key in parameters_of(function)
                    and not any(name_key(t.target) == key for t in find(function, cst.AssignTarget))
                ):
                    return function
        return None


def _trains_in(code: cst.CSTNode, training: set[str], loops: set) -> bool:
    """Whether `code` calls one of the `training` functions or holds a training loop."""
    return called_function(code, training) is not None or any(n in loops for n in descendants(code))


def _space_new_definitions(body: Statements, existing: Sequence[cst.BaseStatement]) -> Statements:
    """Two blank lines after a function or class inserted at module level (black's style)."""
    old = {id(s) for s in existing}
    spaced = list(body)
    for index in range(len(spaced) - 1):
        if (
            isinstance(spaced[index], (cst.FunctionDef, cst.ClassDef))
            and id(spaced[index]) not in old
        ):
            following = spaced[index + 1]
            blank = 0
            while (
                blank < len(following.leading_lines)
                and following.leading_lines[blank].comment is None
            ):
                blank += 1
            missing = [cst.EmptyLine()] * max(0, 2 - blank)
            spaced[index + 1] = following.with_changes(
                leading_lines=[*missing, *following.leading_lines]
            )
    return spaced


def _code(node: cst.CSTNode) -> str:
    return cst.Module([]).code_for_node(node)


def _named(node: cst.CSTNode) -> cst.BaseExpression:
    """What names the model at `node`: the function a call calls, an argument's value,
    or the expression `node` itself (`self.policy` of `self.policy.evaluate(s, a)`)."""
    if isinstance(node, cst.Call):
        return node.func
    return node.value if isinstance(node, cst.Arg) else node  # type: ignore[return-value]


def passed_args(call: cst.Call, function: FunctionInfo) -> list[tuple[cst.Arg, str]]:
    """The arguments of `call` that are plain names, each with the parameter of
    `function` that receives it (by position, or by keyword)."""
    params = function.positional[1:] if function.is_method else function.positional
    passed: list[tuple[cst.Arg, str]] = []
    for position, arg in enumerate(a for a in call.args if a.keyword is None):
        if arg.star:
            break
        if position < len(params):
            passed.append((arg, params[position]))
    all_params = {p.name.value for p in function.node.params.kwonly_params} | set(params)
    passed += [
        (a, a.keyword.value)
        for a in call.args
        if a.keyword is not None and a.keyword.value in all_params
    ]
    return [
        (arg, param) for arg, param in passed if isinstance(arg.value, (cst.Name, cst.Attribute))
    ]


def _target_name(target: cst.BaseExpression) -> str | None:
    """`name`, `self.name`, or `kwargs[sampler]` for `kwargs["sampler"]`."""
    if isinstance(target, cst.Subscript) and len(target.slice) == 1:
        index = target.slice[0].slice
        if isinstance(index, cst.Index) and isinstance(index.value, cst.SimpleString):
            return f"{name_key(target.value)}[{index.value.evaluated_value}]"
    return name_key(target)


def _targets(assign: cst.CSTNode) -> list[cst.BaseExpression]:
    """The names an assignment binds, unpacked (`model, config = ...` binds both)."""
    found: list[cst.BaseExpression] = []
    stack = [t.target for t in assign.targets] if isinstance(assign, cst.Assign) else [assign.target]  # type: ignore[attr-defined]
    while stack:
        target = stack.pop(0)
        if isinstance(target, (cst.Tuple, cst.List)):
            stack[:0] = [element.value for element in target.elements]
        else:
            found.append(target)
    return found


def builds(statement: cst.CSTNode, key: str) -> bool:
    """Whether `statement` assigns `key` (for `models["net"]`, also its container
    `models`) or calls a method of it as a statement (`model.to(device)`,
    `net.apply(init)`, `model.cuda()`)."""
    for node in find(statement, (cst.Assign, cst.AnnAssign)):
        if any(_binds_model(t, key) for t in _targets(node)):
            return True
    return any(
        model_key(expr.value.func.value) == key  # type: ignore[attr-defined]
        for expr in find(statement, cst.Expr)
        if is_method_call(expr.value)
    )


def _binds_model(target: cst.BaseExpression, key: str) -> bool:
    """Whether assigning `target` binds the model `key`: the name itself, or for an item
    key (`models["net"]`) its container (`models = {"net": Net()}`)."""
    container = item_container(key)
    return model_key(target) == key or (container is not None and name_key(target) == container)


def model_key(node: cst.BaseExpression) -> str | None:
    """`name_key`, or for an item of a container named by a plain name and a string that
    is an identifier, `models["net"]` (code that reads it: the steps write it as is)."""
    key = name_key(node)
    if key is not None or not (isinstance(node, cst.Subscript) and len(node.slice) == 1):
        return key
    index = node.slice[0].slice
    container = node.value
    if not (isinstance(container, cst.Name) and isinstance(index, cst.Index)):
        return None
    item = index.value.evaluated_value if isinstance(index.value, cst.SimpleString) else None
    return f'{container.value}["{item}"]' if isinstance(item, str) and item.isidentifier() else None


def item_container(key: str) -> str | None:
    """`models` of the item key `models["net"]`; None for a name."""
    return key.partition("[")[0] if key.endswith('"]') else None


def local_names(function: cst.FunctionDef) -> set[str]:
    """The names `function` binds itself: the parameters in it (its own, and those of the
    functions and lambdas inside it) and the targets of its assignments. Any other name
    it reads is the module's."""
    targets = (name_key(target.target) for target in find(function, cst.AssignTarget))
    params = {param.name.value for param in find(function, cst.Param)}
    return params | {name for name in targets if name is not None}


def parameters_of(function: cst.FunctionDef | None) -> list[str]:
    """Positional parameter names of a function, without `self`; [] for module level."""
    if function is None:
        return []
    params = [p.name.value for p in function.params.params]
    return params[1:] if params[:1] == ["self"] else params


def ddp_name(model_key: str) -> str:
    """The name of a model's DDP wrapper: `model` -> `ddp_model`, `self.net` -> `self.ddp_net`,
    `models["net"]` -> `ddp_net`."""
    if item_container(model_key) is not None:
        return f"ddp_{model_key.split('[')[1][1:-2]}"
    owner, _, attr = model_key.rpartition(".")
    return f"{owner}.ddp_{attr}" if owner else f"ddp_{attr}"


def uncalled_function(step: StepLoop, program: Program | None) -> FunctionInfo | None:
    """The function that holds `step` when nothing in the program can run it: a plain
    function (no method, no decorator) whose name no module of the program reads, as a
    `train_vanilla()` next to the `train_distill()` that this entry point imports."""
    function = step.function
    if program is None or function is None or function.cls is not None or function.node.decorators:
        return None
    reads = (
        name for module in program.modules for name in find(module.tree, cst.Name)
        if name.value == function.name and name is not function.node.name
    )  # fmt: skip
    return function if next(reads, None) is None else None
