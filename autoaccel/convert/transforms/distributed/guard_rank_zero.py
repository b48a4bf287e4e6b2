"""Only rank 0 prints, saves checkpoints and writes files.

Each such statement (adjacent ones together) goes under `if RANK == 0:`; a function that
does nothing but write returns early on the other ranks, and so does one that writes and
keeps state that only its own output reads (a progress bar timing its steps in globals, a
logger's `log()` summing losses in `self`: `own_output`). A call of such a function of a
module the conversion leaves as it is (`save_experiment(...)`, `progress_bar(...)`,
`logger.log(...)` of a utils module) is a write too, guarded where it is called; a writing
function of such a module that also communicates with the other processes (or, under
FSDP, is given the sharded model) is refused with the line of its call.
Statements already guarded by a rank test are left alone. See
`autoaccel.analysis.side_effects` for what counts.
"""

from __future__ import annotations

from functools import cached_property, partial
from pathlib import Path

import libcst as cst

from autoaccel.analysis.program import ClassInfo, FunctionInfo, SourceModule
from autoaccel.analysis.shapes import find, name_calls
from autoaccel.analysis.side_effects import (
    OPENS,
    EffectKind,
    SideEffect,
    Writes,
    find_side_effects,
    function_writes,
    opening_mode,
)
from autoaccel.convert.transforms.distributed._base import (
    RANK,
    DistributedStep,
    callee_in,
    parse_statements,
    rank_zero,
    converted_modules,
    sole_callee,
    where,
)
from autoaccel.cst_edit import code_of, is_docstring, keyword_value, set_keyword

# Functions of `torch.distributed` that only ask about the process group.
_QUERIES = frozenset(
    f"torch.distributed.{name}"
    for name in ("is_available", "is_initialized", "get_rank", "get_world_size", "get_backend")
)


class GuardRankZero(DistributedStep):
    DESCRIPTION = "Print, save and write files on rank 0 only."
    code = "ACC403"
    # Functions that every process must call (`--to fsdp` gathers shards for a save): a
    # writer function that calls one runs on every rank, its writes guarded one by one.
    collectives: tuple[str, ...] = ()

    def runs_on_every_rank(self, module: cst.Module, function: cst.FunctionDef) -> bool:
        """Whether the writer `function` must run on every rank (its writes guarded one
        by one) rather than return early on the others."""
        return bool(self.collectives and name_calls(function, *self.collectives))

    def helper_on_every_rank(
        self, module: cst.Module, call: cst.Call, helper: FunctionInfo
    ) -> str | None:
        """Why `call` of `helper`, a function of another module that writes, must run on
        every rank (it calls a collective of `torch.distributed`), None when rank 0 alone
        may run it."""
        index = helper.module.index
        names = (
            name
            for inner in find(helper.node, cst.Call)
            for name in index.qualified_names(inner.func)
        )
        used = next(
            (n for n in names if n.startswith("torch.distributed.") and n not in _QUERIES), None
        )
        return f"it calls `{used}`, which every process must call" if used else None

    def visit_Module(self, node: cst.Module) -> None:
        self.helpers: dict[cst.Call, FunctionInfo] = {}
        self.writes_of: dict[SourceModule, dict[cst.FunctionDef, Writes]] = {}
        self.output_functions: dict[SourceModule, dict[cst.FunctionDef, frozenset[str]]] = {}
        self.kept_read: dict[cst.Call, tuple[SourceModule, cst.Attribute]] = {}
        found = find_side_effects(node, self.script.index, self._helper_write)
        own = {f for f, keeps in found.output_functions.items() if self.own_output(f, keeps)}
        writers = {f for f in found.writer_functions | own if not self.runs_on_every_rank(node, f)}
        for function in writers:
            self._return_early(function)
        groups: dict[cst.CSTNode, list[SideEffect]] = {}
        self.exist_ok: set[cst.Call] = set()
        for effect in found.effects:
            if effect.guarded or effect.function in writers:
                continue
            if effect.kind is EffectKind.DIRECTORY:
                self._make_on_every_rank(effect.call)  # type: ignore[arg-type]
                continue
            helper = self.helpers.get(effect.call)  # type: ignore[arg-type]
            why = helper and self.helper_on_every_rank(node, effect.call, helper)  # type: ignore[arg-type]
            read = self.kept_read.get(effect.call)  # type: ignore[arg-type]
            if read is not None and not why:
                self._keep_on_every_rank(effect, helper, *read)  # type: ignore[arg-type]
                continue
            if why:
                self.skipped(
                    f"rank-0 {effect.kind.value}",
                    f"`{helper.name}()` ({where(helper.module, helper.node)}) writes on every process, and only"  # type: ignore[union-attr]
                    f" rank 0 may: {why}; put its writes under `if {RANK} == 0:` by hand",
                    effect.call,
                    wrong=True,
                )
                continue
            if effect.statement is None:
                if self._open_on_rank_zero(effect.call) or self._one_line_branch(effect):  # type: ignore[arg-type]
                    continue
                self.skipped(
                    f"rank-0 {effect.kind.value}",
                    f"the {effect.kind.value} is part of an expression; run it on rank 0 only"
                    f" (`if {RANK} == 0:`) by hand",
                    effect.call,
                    wrong=effect.kind is not EffectKind.PRINT,  # processes racing on one file
                )
                continue
            groups.setdefault(effect.statement, []).append(effect)
        for statement in list(groups):
            for later in self._handle_reads_after(statement):
                groups.setdefault(later, [])
        self._guard(dict(sorted(groups.items(), key=lambda item: self.line_of(item[0]))))

    def _handle_reads_after(self, statement: cst.CSTNode) -> list[cst.BaseStatement]:
        """The statements after a guarded `with open(...) as f:` in its block that read `f`
        (SASRec's needless `f.close()` after the block): guarded with it, as on the other
        processes `f` is never bound. One that is not a line of its own is refused."""
        if not isinstance(statement, cst.With):
            return []
        handles = {
            n.value for item in statement.items if item.asname for n in find(item.asname, cst.Name)
        }
        block = self.parent(statement)
        siblings = list(getattr(block, "body", ()))
        readers = [
            later
            for later in siblings[siblings.index(statement) + 1 :]
            if any(
                name.value in handles and not self._names_attribute(name)
                for name in find(later, cst.Name)
            )
        ]
        for later in readers:
            if not isinstance(later, cst.SimpleStatementLine):
                self.skipped(
                    "rank-0 write",
                    f"this block reads `{'`, `'.join(sorted(handles))}`, which the `with` above binds"
                    f" on rank 0 only; put it under `if {RANK} == 0:` too, by hand",
                    later,
                    wrong=True,
                )
        return [later for later in readers if isinstance(later, cst.SimpleStatementLine)]

    def _names_attribute(self, name: cst.Name) -> bool:
        """`name` is the `attr` of an attribute (`x.f`), not a read of `f`."""
        parent = self.parent(name)
        return isinstance(parent, cst.Attribute) and parent.attr is name

    def _helper_write(self, call: cst.Call) -> EffectKind | None:
        """What `call` writes when it runs a function of a module the conversion leaves as
        it is (the modules it converts guard their own writers) that does nothing but
        write, or that writes files and must run on every rank (refused)."""
        helper = sole_callee(self.script.program, call)
        if helper is None or helper.module in self._converted_modules:
            return None
        if helper.module not in self.writes_of:
            self.writes_of[helper.module] = function_writes(
                helper.module.tree,
                helper.module.index,
                partial(callee_in, self.script.program, helper.module),
            )
        writes = self.writes_of[helper.module].get(helper.node)
        if writes is not None and writes.keeps is not None and not writes.only:
            read = self._kept_read(helper.node, writes.keeps)
            if read is not None and writes.kind is not EffectKind.DIRECTORY:
                self.kept_read[call] = read
                self.helpers[call] = helper
                return writes.kind
        if (
            writes is None
            or writes.kind is EffectKind.DIRECTORY
            or not writes.only
            and not self.own_output(helper.node, writes.keeps)
            and (
                writes.kind is EffectKind.PRINT
                or not self.helper_on_every_rank(self.script.module.tree, call, helper)
            )
        ):
            return None
        self.helpers[call] = helper
        return writes.kind

    def own_output(self, function: cst.FunctionDef, keeps: frozenset[str] | None) -> bool:
        """Whether `function`, which writes and keeps the attributes `keeps` of its `self`
        (`SideEffects.output_functions`; None: it does other work), may run on rank 0
        alone: no code of the project reads those attributes but its class's `__init__`
        and such functions (`_kept_read`)."""
        program = self.script.program
        return (
            keeps is not None
            and program is not None
            and function in program.functions
            and self._kept_read(function, keeps) is None
        )

    def _kept_read(
        self, function: cst.FunctionDef, keeps: frozenset[str]
    ) -> tuple[SourceModule, cst.Attribute] | None:
        """Where other code reads an attribute `function` keeps: a logger's `self.epoch`
        no, an early stopper's `self.early_stop`, which the training loop reads, yes."""
        program = self.script.program
        cls = program.functions[function].cls  # type: ignore[union-attr]
        family = cls.family if cls is not None else None
        return next(
            (
                (module, attribute)
                for module in program.modules  # type: ignore[union-attr]
                for attribute in find(module.tree, cst.Attribute)
                if attribute.attr.value in keeps and self._reads_kept(module, attribute, family)
            ),
            None,
        )

    def _reads_kept(
        self, module: SourceModule, attribute: cst.Attribute, family: ClassInfo | None
    ) -> bool:
        """Whether `attribute` of `module` reads what an instance of `family` keeps,
        other than in its `__init__` or a function of `SideEffects.output_functions`."""
        program = self.script.program
        own = program.class_of_self(attribute.value, module)  # type: ignore[union-attr]
        if own is not None and own.family is family:
            method = next(
                a for a in module.index.ancestors(attribute) if isinstance(a, cst.FunctionDef)
            )
            if module not in self.output_functions:
                self.output_functions[module] = find_side_effects(
                    module.tree, module.index
                ).output_functions
            return method.name.value != "__init__" and method not in self.output_functions[module]
        values = program.values_of(attribute.value, module)  # type: ignore[union-attr]
        return any(o.cls is not None and o.cls.family is family for o in values)

    @cached_property
    def _converted_modules(self) -> set[SourceModule]:
        """This module and those a project conversion rewrites with it."""
        script = self.script
        return converted_modules(script.program, script.training, self.options.target) | {
            script.module
        }

    def _keep_on_every_rank(
        self, effect: SideEffect, helper: FunctionInfo, module: SourceModule, read: cst.Attribute
    ) -> None:
        """The call of `helper`, which writes and keeps what other code reads, stays on
        every process: rank 0 alone would leave the others' state behind. Noted; refused
        when it writes files (the processes would race on them)."""
        self.skipped(
            f"rank-0 {effect.kind.value}",
            f"`{helper.name}()` ({where(helper.module, helper.node)}) writes on every process:"
            f" it also keeps `{code_of(read)}`, which {Path(module.path or module.name).name}"
            f" reads, so every process runs it; put its writes under `if {RANK} == 0:` by hand",
            effect.call,
            wrong=effect.kind is not EffectKind.PRINT,
        )

    def _make_on_every_rank(self, call: cst.Call) -> None:
        """`os.makedirs(path)` stays on every process, with `exist_ok=True`: the others
        may list or read the folder (PPO lists its log folder to number its runs), and two
        processes may both find it missing."""
        if keyword_value(call, "exist_ok") is not None:
            return
        self.exist_ok.add(call)
        self.changed(
            call,
            "folder made on every process (`exist_ok=True`: they may all find it missing), not on"
            " rank 0 only: the others may read it",
        )

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.Call:
        if original_node in self.exist_ok:
            return set_keyword(updated_node, "exist_ok", "True")
        return updated_node

    def _open_on_rank_zero(self, call: cst.Call) -> bool:
        """`log = open(path, "w")`, a line of its own: the other processes open `os.devnull`
        instead, so that what the script does with `log` later (writes, `flush()`,
        `close()`) runs on every process and reaches the file from rank 0 alone. False
        for any other shape."""
        assign = self.parent(call)
        line = self.parent(assign)
        if not (
            isinstance(assign, cst.Assign)
            and assign.value is call
            and self.qualified_names(call.func) & OPENS
            and isinstance(line, cst.SimpleStatementLine)
            and len(line.body) == 1
        ):
            return False
        mode = opening_mode(call)
        devnull = f"open(os.devnull{'' if mode is None else ', ' + code_of(mode)})"
        opened = cst.IfExp(
            test=cst.parse_expression(f"{RANK} == 0"),
            body=call,
            orelse=cst.parse_expression(devnull),
        )
        self.replace[line] = [line.with_changes(body=[assign.with_changes(value=opened)])]
        self.imports.append("import os")
        self.changed(
            line, "file opened for writing on rank 0 only: the other processes write to os.devnull"
        )
        return True

    def _one_line_branch(self, effect: SideEffect) -> bool:
        """`if args.tensorboard: configure(...)`, the write alone in a one-line `if` with no
        `else`: `and RANK == 0` joins its test. Whether it was one."""
        line = self.parent(effect.call)
        suite = self.parent(line) if isinstance(line, cst.Expr) else None
        branch = self.parent(suite) if isinstance(suite, cst.SimpleStatementSuite) else None
        if not (
            isinstance(branch, cst.If)
            and branch.body is suite
            and branch.orelse is None
            and len(suite.body) == 1
            and branch not in self.replace
            and not isinstance(self.parent(branch), cst.If)  # (an `elif`)
        ):
            return False
        test = code_of(branch.test)
        low = isinstance(branch.test, (cst.BooleanOperation, cst.IfExp, cst.Lambda, cst.NamedExpr))
        joined = cst.parse_expression(f"{f'({test})' if low else test} and {RANK} == 0")
        self.replace[branch] = [branch.with_changes(test=joined)]
        self.changed(branch, f"{effect.kind.value} on rank 0 only")
        return True

    def _return_early(self, function: cst.FunctionDef) -> None:
        body = cst.ensure_type(function.body, cst.IndentedBlock).body
        first = body[1] if len(body) > 1 and is_docstring(body[0]) else body[0]
        self.before.setdefault(first, []).extend(
            parse_statements(f"if {RANK} != 0:\n    return  # only rank 0 writes\n")
        )
        self.changed(function, f"`{function.name.value}()` writes on rank 0 only")

    def _guard(self, groups: dict[cst.CSTNode, list[SideEffect]]) -> None:
        """One `if RANK == 0:` per run of adjacent statements of a block."""
        runs: list[list[cst.BaseStatement]] = []
        for statement in groups:
            block = self.parent(statement)
            siblings = list(block.body)  # type: ignore[union-attr]
            index = siblings.index(statement)
            if runs and runs[-1][-1] in siblings and siblings.index(runs[-1][-1]) == index - 1:
                runs[-1].append(statement)  # type: ignore[arg-type]
            else:
                runs.append([statement])  # type: ignore[list-item]
        for run in runs:
            self.replace[run[0]] = [rank_zero(run)]
            for statement in run[1:]:
                self.replace[statement] = []
            kinds = sorted({e.kind.value for s in run for e in groups[s]})
            code = (
                "ACC403"
                if any(e.kind is EffectKind.CHECKPOINT for s in run for e in groups[s])
                else "ddp"
            )
            self.changed(run[0], f"{' and '.join(kinds)} on rank 0 only", code)
