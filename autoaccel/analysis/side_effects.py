"""What a training script does to the outside world: prints (and progress bars written to
`sys.stdout`), checkpoint saves, file writes (figures and animations of matplotlib too),
plots sent to a visdom server.

Found in one walk over the file's `ModuleIndex` (parents and imported names), so the distributed target can run each of them
on one process only. Every effect comes with the statement that would be guarded (the
`with open(...)` block around a write, or the line of a call) and whether it is already
limited to one rank. Functions that do nothing but write (`save_checkpoint`) are listed
apart: guarding their body once beats guarding each line. So are functions that write and
keep state for their own output only (`output_functions`): a progress bar that times its
steps in module globals, a logger's `log()` that sums the losses it prints in `self`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import NamedTuple

import libcst as cst

from autoaccel.analysis.index import ModuleIndex, run_visitors
from autoaccel.analysis.names import name_key
from autoaccel.analysis.rank_guards import rank_guarded
from autoaccel.analysis.shapes import bound_name_nodes, find, is_attribute, is_name


class EffectKind(Enum):
    PRINT = "print"
    CHECKPOINT = "checkpoint save"
    FILE_WRITE = "file write"
    # a run of Weights & Biases, a visdom plot: one per process otherwise
    EXPERIMENT_LOG = "experiment log"
    # `os.makedirs(...)`: no file's contents; the other processes may read what is there
    DIRECTORY = "directory creation"


_BY_NAME = {
    "builtins.print": EffectKind.PRINT,
    # progress bars (kuangliu's `progress_bar`, tqdm-less scripts) write to the terminal
    "sys.stdout.write": EffectKind.PRINT,
    "sys.stdout.flush": EffectKind.PRINT,
    "sys.stderr.write": EffectKind.PRINT,
    "sys.stderr.flush": EffectKind.PRINT,
    "torch.save": EffectKind.CHECKPOINT,
    "os.makedirs": EffectKind.DIRECTORY,
    "os.mkdir": EffectKind.FILE_WRITE,
    "os.remove": EffectKind.FILE_WRITE,
    "os.rename": EffectKind.FILE_WRITE,
    "os.replace": EffectKind.FILE_WRITE,
    "shutil.copy": EffectKind.FILE_WRITE,
    "shutil.copyfile": EffectKind.FILE_WRITE,
    "shutil.copy2": EffectKind.FILE_WRITE,
    "shutil.rmtree": EffectKind.FILE_WRITE,
    "json.dump": EffectKind.FILE_WRITE,
    "pickle.dump": EffectKind.FILE_WRITE,
    "numpy.save": EffectKind.FILE_WRITE,
    "numpy.savez": EffectKind.FILE_WRITE,
    "numpy.savetxt": EffectKind.FILE_WRITE,
    "matplotlib.pyplot.savefig": EffectKind.FILE_WRITE,
    "torchvision.utils.save_image": EffectKind.FILE_WRITE,
    "imageio.imwrite": EffectKind.FILE_WRITE,
    "imageio.mimsave": EffectKind.FILE_WRITE,
    "wandb.init": EffectKind.EXPERIMENT_LOG,
    "wandb.log": EffectKind.EXPERIMENT_LOG,
    "wandb.watch": EffectKind.EXPERIMENT_LOG,
    "wandb.save": EffectKind.EXPERIMENT_LOG,
    "wandb.finish": EffectKind.EXPERIMENT_LOG,
    "wandb.config.update": EffectKind.EXPERIMENT_LOG,
    # tensorboard_logger's module-level logger (WideResNet-pytorch: `configure(...)`, then
    # `log_value(...)`): one events file per process otherwise
    "tensorboard_logger.configure": EffectKind.EXPERIMENT_LOG,
    "tensorboard_logger.log_value": EffectKind.EXPERIMENT_LOG,
    "tensorboard_logger.log_histogram": EffectKind.EXPERIMENT_LOG,
    "tensorboard_logger.log_images": EffectKind.EXPERIMENT_LOG,
    "mlflow.log_metric": EffectKind.EXPERIMENT_LOG,
    "mlflow.log_metrics": EffectKind.EXPERIMENT_LOG,
    "mlflow.log_param": EffectKind.EXPERIMENT_LOG,
    "mlflow.log_params": EffectKind.EXPERIMENT_LOG,
    "mlflow.log_artifact": EffectKind.EXPERIMENT_LOG,
}
# The calls that print (under ddp, run on rank 0 only).
PRINTS = frozenset(name for name, kind in _BY_NAME.items() if kind is EffectKind.PRINT)
# Methods that write whatever object they are called on (`Path.write_text`, `fig.savefig`,
# Hugging Face's `model.save_pretrained`).
_WRITING_METHODS = frozenset(
    {"write_text", "write_bytes", "savefig", "to_csv", "mkdir", "save_pretrained"}
)
# What matplotlib's figures and animations write with (`anim.save("gan.gif")`): `save`
# is a write only on an object that a call of matplotlib made.
_MATPLOTLIB_SAVES = frozenset({"save", "savefig"})
# What a visdom client sends to its server: any method of a `visdom.Visdom()` (`viz.line`).
_VISDOM = "visdom.Visdom"
OPENS = frozenset({"builtins.open", "io.open"})
# Experiment log writers: TensorBoard's, and the handlers of `logging` that open a file
# (one event file or log file per process, under torchrun).
SUMMARY_WRITERS = frozenset(
    {
        "torch.utils.tensorboard.SummaryWriter",
        "torch.utils.tensorboard.writer.SummaryWriter",
        "tensorboardX.SummaryWriter",
        "tensorboardX.writer.SummaryWriter",
    }
)
FILE_HANDLERS = frozenset(
    {
        "logging.FileHandler",
        "logging.handlers.RotatingFileHandler",
        "logging.handlers.TimedRotatingFileHandler",
        "logging.handlers.WatchedFileHandler",
    }
)
# Identifiers that say "which process am I": `rank`, `RANK`, `args.local_rank`,
# `dist.get_rank()`, `is_main_process()`, `is_master`.


@dataclass(frozen=True)
class SideEffect:
    kind: EffectKind
    call: cst.Call | cst.Assign  # an assignment: `wandb.run.name = ...`
    # The statement to run on one rank only; None when the call sits inside an
    # expression whose value the script uses (it cannot be skipped on its own).
    statement: cst.BaseStatement | None
    guarded: bool  # already inside a rank test (or after `if rank != 0: return`)
    function: cst.FunctionDef | None  # the innermost function around it


@dataclass
class SideEffects:
    effects: list[SideEffect] = field(default_factory=list)
    # Functions whose every statement writes or computes a local for a write.
    writer_functions: set[cst.FunctionDef] = field(default_factory=set)
    # Functions that write, return nothing, and otherwise only update locals, globals no
    # other code reads, and attributes of their `self`: the names of those attributes
    # (other code must not read them either, which one module cannot tell).
    output_functions: dict[cst.FunctionDef, frozenset[str]] = field(default_factory=dict)


# The kind of what a call of the project's own functions writes, None when it is not a
# write (see `find_side_effects`).
CallKind = Callable[[cst.Call], EffectKind | None]
# The kinds of write, the one a message names first.
_SEVERITY = (
    EffectKind.CHECKPOINT,
    EffectKind.FILE_WRITE,
    EffectKind.EXPERIMENT_LOG,
    EffectKind.PRINT,
    EffectKind.DIRECTORY,
)


class _Collector(cst.CSTVisitor):
    def __init__(self, index: ModuleIndex, project_calls: CallKind | None = None) -> None:
        super().__init__()
        self.index = index
        self.project_calls = project_calls
        self.found = SideEffects()
        self.function_effects: dict[cst.FunctionDef, list[SideEffect]] = {}
        self.matplotlib_objects: set[str] = set()  # names bound to what matplotlib made
        self.visdom_objects: set[str] = set()  # names bound to `visdom.Visdom()`

    def visit_Call(self, node: cst.Call) -> None:
        kind = self._kind(node)
        if kind is not None:
            self._add(kind, node, self._statement(node))

    def visit_Assign(self, node: cst.Assign) -> None:
        made_by = (
            self.index.qualified_names(node.value.func)
            if isinstance(node.value, cst.Call)
            else frozenset()
        )
        objects = (
            self.matplotlib_objects
            if any(name.startswith("matplotlib.") for name in made_by)
            else self.visdom_objects if _VISDOM in made_by else None
        )
        if objects is not None:
            for assigned in node.targets:
                target = assigned.target  # `fig, ax = plt.subplots()` binds both
                tuple_like = isinstance(target, (cst.Tuple, cst.List))
                parts = [e.value for e in target.elements] if tuple_like else [target]  # type: ignore[attr-defined]
                objects |= {key for key in map(name_key, parts) if key is not None}
        # `wandb.run.name = ...`: the run exists on the process that started it only.
        if any(
            name.startswith("wandb.")
            for target in node.targets
            for name in self.index.qualified_names(target.target)
        ):
            line = self.index.parent(node)
            statement = (
                line if isinstance(line, cst.SimpleStatementLine) and len(line.body) == 1 else None
            )
            self._add(EffectKind.EXPERIMENT_LOG, node, statement)

    def _add(
        self, kind: EffectKind, node: cst.Call | cst.Assign, statement: cst.BaseStatement | None
    ) -> None:
        function = next(
            (a for a in self.index.ancestors(node) if isinstance(a, cst.FunctionDef)), None
        )
        effect = SideEffect(kind, node, statement, self._guarded(node), function)
        self.found.effects.append(effect)
        if function is not None:
            self.function_effects.setdefault(function, []).append(effect)

    def leave_FunctionDef(self, original_node: cst.FunctionDef) -> None:
        effects = self.function_effects.get(original_node)
        if not effects or any(e.guarded for e in effects):
            return
        writes = {e.statement for e in effects}
        body = original_node.body
        if (
            None not in writes
            and isinstance(body, cst.IndentedBlock)
            and all(_only_writes(s, writes) for s in body.body)
        ):
            self.found.writer_functions.add(original_node)
        keeps = _OwnState(original_node, writes, self.index).attributes()
        if keeps is not None:
            self.found.output_functions[original_node] = keeps

    # -- what a call does -------------------------------------------------------------
    def _kind(self, call: cst.Call) -> EffectKind | None:
        names = self.index.qualified_names(call.func)
        for name in names:
            if name in _BY_NAME:
                return _BY_NAME[name]
        if names & OPENS:
            return EffectKind.FILE_WRITE if opens_for_writing(call) else None
        if not names and is_attribute(call.func, *_WRITING_METHODS):
            return EffectKind.FILE_WRITE
        func = call.func
        if isinstance(func, cst.Attribute) and name_key(func.value) in self.visdom_objects:
            return EffectKind.EXPERIMENT_LOG
        if isinstance(func, cst.Attribute) and is_attribute(func, *_MATPLOTLIB_SAVES):
            return (
                EffectKind.FILE_WRITE if name_key(func.value) in self.matplotlib_objects else None
            )
        return self.project_calls(call) if self.project_calls is not None else None

    # -- where it sits --------------------------------------------------------------
    def _statement(self, call: cst.Call) -> cst.BaseStatement | None:
        """`with open(...) as f:` for an opened file, the line of a call statement, also
        of one the call is an argument of (`pickle.dump(vocab, open(path, "wb"))`: the
        statement's value is dropped). (Not `with wandb.init():`: its block may hold the
        whole training.)"""
        parent = self.index.parent(call)
        if isinstance(parent, cst.WithItem):
            opens = self.index.qualified_names(call.func) & OPENS
            return self.index.parent(parent) if opens else None  # type: ignore[return-value]
        while isinstance(parent, cst.Arg) and isinstance(
            outer := self.index.parent(parent), cst.Call
        ):
            parent = self.index.parent(outer)
        line = self.index.parent(parent) if isinstance(parent, cst.Expr) else None
        if isinstance(line, cst.SimpleStatementLine) and len(line.body) == 1:
            return line
        return None

    def _guarded(self, node: cst.CSTNode) -> bool:
        return rank_guarded(node, self.index.ancestors(node))


def opening_mode(call: cst.Call) -> cst.BaseExpression | None:
    """The mode argument of an `open(...)` call; None when it has none ("r")."""
    mode = next((a.value for a in call.args if a.keyword and a.keyword.value == "mode"), None)
    if mode is None:
        positional = [a for a in call.args if a.keyword is None]
        mode = positional[1].value if len(positional) > 1 else None
    return mode


def opens_for_writing(call: cst.Call) -> bool:
    """Whether an `open(...)` call's mode may write (`"w"`, `"ab"`, `"r+"`, a mode it cannot read)."""
    mode = opening_mode(call)
    if mode is None:
        return False  # "r"
    if isinstance(mode, cst.SimpleString):
        return any(flag in mode.evaluated_value for flag in "wax+")
    return True  # a mode we cannot read may write


def _only_writes(statement: cst.BaseStatement, writes: set[cst.BaseStatement | None]) -> bool:
    """A write, a docstring, an assignment to plain local names or their `del` (SupContrast's
    `save_model()` ends `del state`), or a block of those."""
    if statement in writes:
        return True
    if isinstance(statement, cst.SimpleStatementLine):
        return all(
            (
                isinstance(small, cst.Assign)
                and all(isinstance(t.target, cst.Name) for t in small.targets)
            )
            or (isinstance(small, cst.Del) and _names_only(small.target))
            or (isinstance(small, cst.Expr) and isinstance(small.value, cst.SimpleString))
            or isinstance(small, cst.Pass)
            for small in statement.body
        )
    return isinstance(statement, cst.If) and _blocks_all(
        statement, lambda s: _only_writes(s, writes)
    )


def _names_only(target: cst.BaseExpression) -> bool:
    """Whether `target` of a `del` names plain names only (`del a, b`)."""
    if isinstance(target, (cst.Tuple, cst.List)):
        return all(_names_only(element.value) for element in target.elements)
    return isinstance(target, cst.Name)


def _blocks_all(statement: cst.If | cst.For, test: Callable[[cst.BaseStatement], bool]) -> bool:
    """Whether every statement of every block of `statement` (its `elif`s and `else`
    too) passes `test`; False for a one-line block (`if x: y`)."""
    blocks: list[cst.BaseSuite] = [statement.body]
    orelse = statement.orelse
    while orelse is not None:
        blocks.append(orelse.body)
        orelse = orelse.orelse if isinstance(orelse, cst.If) else None
    return all(isinstance(b, cst.IndentedBlock) and all(map(test, b.body)) for b in blocks)


_DISPLAYS = (
    cst.List, cst.Dict, cst.Set, cst.Tuple, cst.ListComp, cst.DictComp, cst.SetComp,
    cst.SimpleString, cst.FormattedString, cst.ConcatenatedString,
)  # fmt: skip


class _OwnState:
    """What a function that writes keeps besides, when that is its own: the attributes of
    its `self` it sets or changes; None when it returns a value, changes anything else
    (a parameter's contents, a global that code after its `def` reads) or calls anything
    but a write or a method of a display it made (`lines.append(...)`)."""

    def __init__(
        self, function: cst.FunctionDef, writes: set[cst.BaseStatement | None], index: ModuleIndex
    ) -> None:
        self.function = function
        self.writes = writes
        self.index = index
        self.globals = {n.name.value for g in find(function, cst.Global) for n in g.names}
        # locals that only ever hold a display of the function's own (`lines = []`):
        # calling their methods changes nothing outside it
        bound: dict[str, list[cst.BaseExpression | None]] = {}
        for node in find(function.body, (cst.Assign, cst.AugAssign, cst.AnnAssign, cst.For)):
            if isinstance(node, cst.Assign):
                targets, value = [t.target for t in node.targets], node.value
            elif isinstance(node, (cst.AugAssign, cst.AnnAssign, cst.For)):
                targets, value = [node.target], None
            for target in targets:
                for name in bound_name_nodes(target):
                    bound.setdefault(name.value, []).append(value if target is name else None)
        parameters = {p.name.value for p in find(function.params, cst.Param)}
        self.module_functions = {f.name.value for f in find(index.module, cst.FunctionDef)}
        self.fresh = {
            name
            for name, values in bound.items()
            if name not in parameters and all(isinstance(v, _DISPLAYS) for v in values)
        }
        params = function.params.params
        in_class = isinstance(index.parent(index.parent(function)), cst.ClassDef)  # type: ignore[arg-type]
        self.self_name = params[0].name.value if in_class and params else None
        self.kept: set[str] = set()

    def attributes(self) -> frozenset[str] | None:
        body = self.function.body
        if find(body, (cst.Yield, cst.Lambda, cst.FunctionDef, cst.ClassDef)) or any(
            r.value is not None for r in find(body, cst.Return)
        ):
            return None
        if not isinstance(body, cst.IndentedBlock) or not all(map(self._keeps, body.body)):
            return None
        return None if self._globals_read_elsewhere() else frozenset(self.kept)

    def _keeps(self, statement: cst.BaseStatement) -> bool:
        if statement in self.writes:
            return True
        if isinstance(statement, (cst.If, cst.For)):
            return _blocks_all(statement, self._keeps)
        return isinstance(statement, cst.SimpleStatementLine) and all(
            self._small(small) for small in statement.body
        )

    def _small(self, small: cst.BaseSmallStatement) -> bool:
        if isinstance(small, cst.Assign):
            return all(self._own(t.target) for t in small.targets) and self._idle(small.value)
        if isinstance(small, (cst.AugAssign, cst.AnnAssign)):
            return self._own(small.target) and self._idle(small.value)
        if isinstance(small, cst.Expr):
            value = small.value
            if isinstance(value, cst.SimpleString):
                return True
            func = value.func if isinstance(value, cst.Call) else None
            receiver = func.value if isinstance(func, cst.Attribute) else None
            return isinstance(receiver, cst.Name) and receiver.value in self.fresh
        return isinstance(
            small, (cst.Pass, cst.Global, cst.Return, cst.Break, cst.Continue, cst.Assert)
        )

    def _idle(self, value: cst.BaseExpression | None) -> bool:
        """Whether computing `value` may do no work of the program: it calls no method of
        its `self` (SimGNN's `fit()` prints, and trains in `loss_sum +=
        self.process_batch(batch)`), nor a function of the module."""
        for call in find(value, cst.Call) if value is not None else ():
            func = call.func
            if isinstance(func, cst.Name) and func.value in self.module_functions:
                return False
            if (
                isinstance(func, cst.Attribute)
                and self.self_name is not None
                and is_name(func.value, self.self_name)
            ):
                return False
        return True

    def _own(self, target: cst.BaseExpression) -> bool:
        """Whether assigning to `target` (or changing it) changes state of the function's
        own: a name, an element of a display it made, an attribute of `self` (kept)."""
        if isinstance(target, (cst.Tuple, cst.List)):
            return all(self._own(e.value) for e in target.elements)
        root, first = target, None
        while isinstance(root, (cst.Attribute, cst.Subscript)):
            root, first = root.value, root
        if not isinstance(root, cst.Name):
            return False
        if first is None or root.value in self.fresh:
            return True
        if root.value == self.self_name and isinstance(first, cst.Attribute):
            self.kept.add(first.attr.value)
            return True
        return False

    def _globals_read_elsewhere(self) -> bool:
        """Whether code outside the function reads a global it sets, other than the
        top-level statements before its `def`."""
        module = self.index.module
        statements: list[cst.CSTNode] = list(module.body)
        position = statements.index([self.function, *self.index.ancestors(self.function)][-2])
        for name in find(module, cst.Name) if self.globals else ():
            ancestors = list(self.index.ancestors(name))
            parent = ancestors[0]
            if (
                name.value not in self.globals
                or self.function in ancestors
                or isinstance(parent, (cst.Attribute, cst.Arg))  # `x.name`, `f(name=...)`
                and name in (getattr(parent, "attr", None), getattr(parent, "keyword", None))
            ):
                continue
            if statements.index(ancestors[-2]) >= position:
                return True
        return False


def find_side_effects(
    module: cst.Module, index: ModuleIndex | None = None, project_calls: CallKind | None = None
) -> SideEffects:
    """Prints, checkpoint saves and file writes of `module` (pass its `index` when it
    is built already); `project_calls` gives the kind of write of a call of the project's
    own functions (`save_experiment(...)` of a utils module), if any."""
    collector = _Collector(index or ModuleIndex(module), project_calls)
    run_visitors(module, [collector])
    return collector.found


class Writes(NamedTuple):
    kind: EffectKind  # the weightiest: a checkpoint save, then a file write, then a print
    only: bool  # the function does nothing but write
    # the attributes of `self` it keeps when it only writes and keeps state of its own
    # (`SideEffects.output_functions`), None when it does other work
    keeps: frozenset[str] | None = None


def function_writes(
    module: cst.Module,
    index: ModuleIndex | None = None,
    callee: Callable[[cst.Call], cst.FunctionDef | None] | None = None,
) -> dict[cst.FunctionDef, Writes]:
    """What each function of `module` that writes on every rank (not under a rank test)
    writes. With `callee` (the function of `module` a call runs, if any), a call of a
    function that does nothing but write is a write too (`save_checkpoint(...)` in the
    `save_experiment()` beside it), followed until nothing new is found."""
    index = index or ModuleIndex(module)
    found: dict[cst.FunctionDef, Writes] = {}
    while True:

        def writes_of_callee(call: cst.Call) -> EffectKind | None:
            writes = found.get(callee(call)) if callee is not None else None  # type: ignore[arg-type]
            return writes.kind if writes is not None and writes.only else None

        effects = find_side_effects(module, index, writes_of_callee)
        kinds: dict[cst.FunctionDef, list[EffectKind]] = {}
        for effect in effects.effects:
            if effect.function is not None and not effect.guarded:
                kinds.setdefault(effect.function, []).append(effect.kind)
        now = {
            function: Writes(
                min(found_kinds, key=_SEVERITY.index),
                function in effects.writer_functions,
                effects.output_functions.get(function),
            )
            for function, found_kinds in kinds.items()
        }
        if now == found:
            return found
        found = now
