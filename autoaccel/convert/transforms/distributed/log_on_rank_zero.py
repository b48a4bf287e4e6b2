"""Experiment logs come from rank 0 only: TensorBoard writers, Weights & Biases runs the
script keeps, logger classes of the project (yunjey's `Logger` over a writer, bearpaw's
over a file it opens) and `logging` file handlers.

`writer = SummaryWriter(log_dir)` on every process made one event file per process in the
same folder, and TensorBoard drew every process's curves (pytorch-vqvae logs its losses
from `train()`); `run = wandb.init(...)` made one run per process. The writer or run is
made on rank 0; the other ranks get a `NoWriter()`, which does nothing whatever it is
asked, so the calls that log (`writer.add_scalar(...)` in a function the writer is passed
to, `run.log(...)`, `with wandb.init() as run:` around the training) need no rank test of
their own. (A plain `wandb.init(...)` statement, like `wandb.log(...)`, goes under `if
RANK == 0:` with the prints: see `guard_rank_zero.py`.) A `logging.FileHandler(path)` is
made on rank 0; the other ranks get a `logging.NullHandler()` in its place and keep the
script's other handlers: each process's warnings and errors still reach the terminal.
`logging.basicConfig(level=logging.INFO)` keeps that level on rank 0 only, WARNING on the
others (mnist-gradient-accumulation's "Saved best model" came from every process).
A `SummaryWriter()` without a folder writes to one named after the time and host
(`runs/<date>_<host>`), which only rank 0's writer knows: where the project reads a writer's
folder (PyTorch-BYOL saves its checkpoints in `writer.log_dir`), the other ranks' `NoWriter()`
gets rank 0's (`with_rank_zero_log_dir(...)`, a broadcast).
"""

from __future__ import annotations

from functools import partial

import libcst as cst

from autoaccel.analysis.program import ClassInfo, SourceModule
from autoaccel.analysis.rank_guards import mentions_rank, rank_guarded
from autoaccel.analysis.shapes import find, is_method_call, is_name
from autoaccel.analysis.side_effects import (
    FILE_HANDLERS,
    OPENS,
    SUMMARY_WRITERS,
    EffectKind,
    SideEffects,
    find_side_effects,
)
from autoaccel.convert.transforms.distributed._base import (
    DIST_IMPORT,
    DISTRIBUTED,
    RANK,
    DistributedStep,
)
from autoaccel.cst_edit import code_of, keyword_value, replacing, set_keyword

WANDB_INIT = "wandb.init"
# What a logger class of the project may make in its `__init__` to write its logs.
_WRITER_FACTORIES = SUMMARY_WRITERS | {
    "tensorflow.summary.FileWriter",
    "tensorflow.summary.create_file_writer",
    "tensorflow.compat.v1.summary.FileWriter",
}
# What a logger that writes a file of its own may keep in `self` besides: containers it
# fills (`self.numbers = {}`) and nothing (`self.file = None`).
_OWN_VALUES = (cst.List, cst.Dict, cst.Set)
# `logging.basicConfig(level=...)`: the level of the processes other than rank 0 is WARNING.
BASIC_CONFIG = "logging.basicConfig"
HELPER = "NoWriter"
_HELPER_CODE = f'''
class {HELPER}:
    """The log writer (SummaryWriter, wandb run, logger) of the ranks other than 0: it
    does nothing, whatever it is asked, but tells the folder rank 0's writer writes to
    (paths are made from it)."""

    def __init__(self, log_dir=None):
        self.log_dir = self.logdir = log_dir

    def get_logdir(self):
        return self.log_dir

    def __getattr__(self, name):
        return self

    def __call__(self, *args, **kwargs):
        return self

    def __getitem__(self, key):
        return self

    def __setitem__(self, key, value):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        return False
'''


SHARED_FOLDER = "with_rank_zero_log_dir"
_SHARED_FOLDER_CODE = f'''
def {SHARED_FOLDER}(writer):
    """`writer`, with the folder rank 0's writer chose (a default one, named after the
    time and host) on every process: paths are made from it."""
    if {DISTRIBUTED}:
        folder = [writer.log_dir]
        dist.broadcast_object_list(folder, src=0)
        writer.log_dir = writer.logdir = folder[0]
    return writer
'''
# What a writer's folder is read through: `writer.log_dir`, tensorboardX's `logdir`.
_FOLDER_READS = frozenset({"log_dir", "logdir", "get_logdir"})


def _trains(cls: ClassInfo) -> bool:
    """Whether a method of `cls` trains (`loss.backward()`, `optimizer.step()`): a trainer
    that makes its own writer is no logger, and must run on every rank."""
    return any(
        is_method_call(call, "backward", "step")
        for ancestor in cls.mro()
        for call in find(ancestor.node, cst.Call)
    )


class LogOnRankZero(DistributedStep):
    DESCRIPTION = "Make log writers (TensorBoard, kept wandb runs, loggers) on rank 0 only."

    def visit_Module(self, node: cst.Module) -> None:
        self.loggers: dict[ClassInfo, bool] = {}  # `_is_a_logger`, once per class
        self.writers = {
            call
            for call in find(node, cst.Call)
            if self._makes_a_writer(call) and not rank_guarded(call, self.ancestors(call))
        }
        if any(not self._is_a_file_handler(call) for call in self.writers):
            self.define_helper(node, HELPER, _HELPER_CODE)
        self.shared_folders = {
            call
            for call in self.writers
            if self.qualified_names(call.func) & SUMMARY_WRITERS
            and self._log_dir(call) is None
            and self._folder_read()
        }
        if self.shared_folders:
            self.define_helper(node, SHARED_FOLDER, _SHARED_FOLDER_CODE)
            self.imports.append(DIST_IMPORT)
        self.levels = {
            call
            for call in find(node, cst.Call)
            if BASIC_CONFIG in self.qualified_names(call.func)
            and (level := keyword_value(call, "level")) is not None
            and not mentions_rank(level)
            and not rank_guarded(call, self.ancestors(call))
        }

    def _makes_a_writer(self, call: cst.Call) -> bool:
        """A SummaryWriter, a wandb run whose value the script keeps, or a logger of the
        project (see `_is_a_logger`)."""
        names, parent = self.qualified_names(call.func), self.parent(call)
        return (
            bool(names & (SUMMARY_WRITERS | FILE_HANDLERS))
            or (WANDB_INIT in names and not isinstance(parent, cst.Expr))
            or isinstance(parent, (cst.Assign, cst.AnnAssign))  # a logger kept in a name
            and any(
                obj.node is call and obj.cls is not None and self._is_a_logger(obj.cls)
                for obj in self.script.values(call)
            )
        )

    def _is_a_logger(self, cls: ClassInfo) -> bool:
        """`_logs_only(cls)`, asked once per class."""
        if cls not in self.loggers:
            self.loggers[cls] = self._logs_only(cls)
        return self.loggers[cls]

    def _logs_only(self, cls: ClassInfo) -> bool:
        """A class of the project that derives from `SummaryWriter` (melgan's `MyWriter`)
        or whose `__init__` makes a log writer (L1aoXingyu's and yunjey's `Logger`, over
        `tf.summary.FileWriter`), none of whose methods returns a value; or one that
        writes a file it opens in `__init__` (`_writes_its_own_file`): its instance may
        be a `NoWriter()` elsewhere."""
        init = cls.method("__init__")
        if not cls.derives_from(*SUMMARY_WRITERS) and init is None or _trains(cls):
            return False
        if cls.derives_from(*SUMMARY_WRITERS) or any(
            init.module.index.qualified_names(call.func) & _WRITER_FACTORIES  # type: ignore[union-attr]
            for call in find(init.node, cst.Call)  # type: ignore[union-attr]
        ):
            return not any(
                node.value is not None and not is_name(node.value, "None")
                for node in find(cls.node, cst.Return)
            )
        return self._writes_its_own_file(cls)

    def _writes_its_own_file(self, cls: ClassInfo) -> bool:
        """Whether `cls` opens a file for writing in `__init__`, and every method of it
        only writes (through that file, to the terminal, on matplotlib's figure) and keeps
        state of its own that no other code reads (bearpaw's `Logger`: `set_names()`,
        `append()` a row, `plot()`, `close()`)."""
        own = self._own_attributes(cls)
        found: dict[SourceModule, SideEffects] = {}
        for ancestor in cls.mro():
            module = ancestor.module
            if module not in found:
                found[module] = find_side_effects(
                    module.tree, module.index, partial(self._logs, cls, module, own)
                )
        init = cls.method("__init__")
        return (
            any(
                effect.function is init.node  # type: ignore[union-attr]
                and effect.kind is EffectKind.FILE_WRITE
                and init.module.index.qualified_names(effect.call.func) & OPENS  # type: ignore[union-attr]
                for effect in found[init.module].effects  # type: ignore[union-attr]
            )
            and all(
                method.node in found[ancestor.module].output_functions
                for ancestor in cls.mro()
                for method in ancestor.methods.values()
            )
            and not self._read_elsewhere(cls)
        )

    def _set_on_self(self, cls: ClassInfo) -> dict[str, list[cst.BaseExpression]]:
        """The values the methods of `cls` assign to each attribute of their `self`."""
        program = self.script.program
        assigned: dict[str, list[cst.BaseExpression]] = {}
        for ancestor in cls.mro():
            for assign in find(ancestor.node, cst.Assign):
                for target in assign.targets:
                    attribute = target.target
                    if isinstance(attribute, cst.Attribute) and program.class_of_self(  # type: ignore[union-attr]
                        attribute.value, ancestor.module
                    ):
                        assigned.setdefault(attribute.attr.value, []).append(assign.value)
        return assigned

    def _own_attributes(self, cls: ClassInfo) -> frozenset[str]:
        """The attributes of `self` that only ever hold a container of the class's own,
        None, or a file or writer it opens: changing them changes nothing elsewhere."""
        module = cls.module
        return frozenset(
            name
            for name, values in self._set_on_self(cls).items()
            if all(
                isinstance(value, _OWN_VALUES)
                or is_name(value, "None")
                or isinstance(value, cst.Call)
                and module.index.qualified_names(value.func) & (OPENS | _WRITER_FACTORIES)
                for value in values
            )
        )

    def _logs(
        self, cls: ClassInfo, module: SourceModule, own: frozenset[str], call: cst.Call
    ) -> EffectKind | None:
        """For `find_side_effects` over the module of `cls`: a call of a method of what its
        `self` owns (`self.file.write(...)`, `self.numbers[name].append(x)`), or one that
        draws on matplotlib's figure, counts as a write of the logger's."""
        if any(n.startswith("matplotlib.pyplot.") for n in module.index.qualified_names(call.func)):
            return EffectKind.FILE_WRITE
        receiver = call.func.value if isinstance(call.func, cst.Attribute) else None
        while isinstance(receiver, (cst.Attribute, cst.Subscript)):
            if isinstance(receiver, cst.Attribute) and isinstance(receiver.value, cst.Name):
                owner = self.script.program.class_of_self(receiver.value, module)  # type: ignore[union-attr]
                if owner is not None and owner.family is cls.family and receiver.attr.value in own:
                    return EffectKind.FILE_WRITE
            receiver = receiver.value
        return None

    def _read_elsewhere(self, cls: ClassInfo) -> bool:
        """Whether code outside the methods of `cls` reads an attribute its instances
        keep (`logger.names`): a `NoWriter()` has none."""
        program = self.script.program
        kept = self._set_on_self(cls)
        return any(
            attribute.attr.value in kept
            and program.class_of_self(attribute.value, module) is None  # type: ignore[union-attr]
            and any(
                o.cls is not None and o.cls.family is cls.family
                for o in program.values_of(attribute.value, module)  # type: ignore[union-attr]
            )
            for module in program.modules  # type: ignore[union-attr]
            for attribute in find(module.tree, cst.Attribute)
        )

    def _folder_read(self) -> bool:
        """Whether a module of the program reads a writer's folder (`writer.log_dir`)."""
        program = self.script.program
        trees = [m.tree for m in program.modules] if program is not None else []
        return any(
            attribute.attr.value in _FOLDER_READS
            for tree in trees or [self.script.index.module]  # type: ignore[union-attr]
            for attribute in find(tree, cst.Attribute)
        )

    def edited(self) -> list[cst.CSTNode]:
        return [*self.planned_statements(), *self.writers, *self.levels]

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        if original_node in self.levels:
            level = code_of(keyword_value(updated_node, "level"))  # type: ignore[arg-type]
            self.imports.append("import logging")
            self.changed(
                original_node,
                "`logging` messages below warnings from rank 0 only: the others' info lines"
                " repeated rank 0's",
            )
            return set_keyword(
                updated_node, "level", f"{level} if {RANK} == 0 else logging.WARNING"
            )
        if original_node not in self.writers:
            return updated_node
        self.changed(
            original_node,
            (
                "`logging` file handler made on rank 0 only; the other ranks log through"
                " their other handlers (a `logging.NullHandler()` in its place)"
                if self._is_a_file_handler(original_node)
                else f"{self._writer_kind(original_node)} made on rank 0 only; the other ranks"
                f" log through `{HELPER}()`, which does nothing"
            ),
        )
        if self._is_a_file_handler(original_node):
            self.imports.append("import logging")
            other = "logging.NullHandler()"
        else:
            folder = self._log_dir(original_node)
            other = f"{HELPER}(log_dir={code_of(folder)})" if folder else f"{HELPER}()"
        chosen = cst.parse_expression(f"WRITER if {RANK} == 0 else {other}")
        assert isinstance(chosen, cst.IfExp)
        made: cst.BaseExpression = chosen.with_changes(body=updated_node)
        if original_node in self.shared_folders:
            made = cst.Call(cst.Name(SHARED_FOLDER), [cst.Arg(made)])
        return replacing(original_node, self.parent(original_node), made)

    def _log_dir(self, call: cst.Call) -> cst.BaseExpression | None:
        """The folder a SummaryWriter call names (`log_dir=`, tensorboardX's `logdir=`, or
        the first argument): pytorch-semseg saves its best model into
        `writer.file_writer.get_logdir()`, which every process computes."""
        if not self.qualified_names(call.func) & SUMMARY_WRITERS:
            return None
        keyword = next(
            (a for a in call.args if a.keyword and a.keyword.value in ("log_dir", "logdir")), None
        )
        first = (
            call.args[0]
            if call.args and not call.args[0].keyword and not call.args[0].star
            else None
        )
        arg = keyword or first
        return arg.value if arg else None

    def _is_a_file_handler(self, call: cst.Call) -> bool:
        return bool(self.qualified_names(call.func) & FILE_HANDLERS)

    def _writer_kind(self, call: cst.Call) -> str:
        names = self.qualified_names(call.func)
        if WANDB_INIT in names:
            return "wandb run"
        if names & SUMMARY_WRITERS:
            return "TensorBoard writer"
        return f"`{cst.Module([]).code_for_node(call.func)}` logger"
