"""What a training script does to the outside world: prints (and progress bars written to
`sys.stdout`), checkpoint saves, file writes (figures and animations of matplotlib too).

Found in one walk over the file's `ModuleIndex` (parents and imported names), so the distributed target can run each of them
on one process only. Every effect comes with the statement that would be guarded (the
`with open(...)` block around a write, or the line of a call) and whether it is already
limited to one rank. Functions that do nothing but write (`save_checkpoint`) are listed
apart: guarding their body once beats guarding each line.
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
from autoaccel.analysis.shapes import is_attribute


class EffectKind(Enum):
    PRINT = "print"
    CHECKPOINT = "checkpoint save"
    FILE_WRITE = "file write"
    EXPERIMENT_LOG = "experiment log"  # a run of Weights & Biases: one per process otherwise
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
OPENS = frozenset({"builtins.open", "io.open"})
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

    def visit_Call(self, node: cst.Call) -> None:
        kind = self._kind(node)
        if kind is not None:
            self._add(kind, node, self._statement(node))

    def visit_Assign(self, node: cst.Assign) -> None:
        if isinstance(node.value, cst.Call) and any(
            name.startswith("matplotlib.") for name in self.index.qualified_names(node.value.func)
        ):
            for assigned in node.targets:
                target = assigned.target  # `fig, ax = plt.subplots()` binds both
                tuple_like = isinstance(target, (cst.Tuple, cst.List))
                parts = [e.value for e in target.elements] if tuple_like else [target]  # type: ignore[attr-defined]
                self.matplotlib_objects |= {key for key in map(name_key, parts) if key is not None}
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
        if effects and all(e.statement is not None and not e.guarded for e in effects):
            writes = {e.statement for e in effects}
            if all(_only_writes(s, writes) for s in original_node.body.body):
                self.found.writer_functions.add(original_node)

    # -- what a call does -------------------------------------------------------------
    def _kind(self, call: cst.Call) -> EffectKind | None:
        names = self.index.qualified_names(call.func)
        for name in names:
            if name in _BY_NAME:
                return _BY_NAME[name]
        if names & OPENS:
            return EffectKind.FILE_WRITE if _opens_for_writing(call) else None
        if not names and is_attribute(call.func, *_WRITING_METHODS):
            return EffectKind.FILE_WRITE
        func = call.func
        if is_attribute(func, *_MATPLOTLIB_SAVES):
            return EffectKind.FILE_WRITE if name_key(func.value) in self.matplotlib_objects else None  # type: ignore[attr-defined]
        return self.project_calls(call) if self.project_calls is not None else None

    # -- where it sits --------------------------------------------------------------
    def _statement(self, call: cst.Call) -> cst.BaseStatement | None:
        """`with open(...) as f:` for an opened file, the line of a call statement. (Not
        `with wandb.init():`: its block may hold the whole training.)"""
        parent = self.index.parent(call)
        if isinstance(parent, cst.WithItem):
            opens = self.index.qualified_names(call.func) & OPENS
            return self.index.parent(parent) if opens else None  # type: ignore[return-value]
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


def _opens_for_writing(call: cst.Call) -> bool:
    mode = opening_mode(call)
    if mode is None:
        return False  # "r"
    if isinstance(mode, cst.SimpleString):
        return any(flag in mode.evaluated_value for flag in "wax+")
    return True  # a mode we cannot read may write


def _only_writes(statement: cst.BaseStatement, writes: set[cst.BaseStatement]) -> bool:
    """A write, a docstring, an assignment to plain local names, or a block of those."""
    if statement in writes:
        return True
    if isinstance(statement, cst.SimpleStatementLine):
        return all(
            (
                isinstance(small, cst.Assign)
                and all(isinstance(t.target, cst.Name) for t in small.targets)
            )
            or (isinstance(small, cst.Expr) and isinstance(small.value, cst.SimpleString))
            or isinstance(small, cst.Pass)
            for small in statement.body
        )
    if isinstance(statement, cst.If):
        branches: list[cst.BaseSuite] = [statement.body]
        orelse = statement.orelse
        while orelse is not None:
            branches.append(orelse.body)
            orelse = orelse.orelse if isinstance(orelse, cst.If) else None
        return all(
            isinstance(b, cst.IndentedBlock) and all(_only_writes(s, writes) for s in b.body)
            for b in branches
        )
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
                min(found_kinds, key=_SEVERITY.index), function in effects.writer_functions
            )
            for function, found_kinds in kinds.items()
        }
        if now == found:
            return found
        found = now
