"""`train_loader.sampler.set_epoch(epoch)` at the start of every epoch.

`DistributedSampler` shuffles with a seed made of its own seed and the epoch it was told;
without `set_epoch` every epoch reads the same order. The call goes at the top of the
epoch loop, which is found around the training step loop, or around a call of the
function that holds it (`for epoch ...: train(..., train_loader, ...)`), in this module
or in another module of the project that calls it (`loops.train_one(...)` in `main()`).
A loader built anew in the epoch loop (fresh samples every epoch) gets it right after it
is built: its new `DistributedSampler` starts at epoch 0, and would shuffle every epoch's
data in the same order.
"""

from __future__ import annotations

from collections.abc import Sequence

import libcst as cst
import libcst.matchers as m

from autoaccel.analysis.index import ModuleIndex
from autoaccel.analysis.names import name_key
from autoaccel.analysis.phases import phases_of
from autoaccel.analysis.program import Program
from autoaccel.analysis.shapes import bound_names, find, method_calls
from autoaccel.analysis.training import LoopRole, StepLoop
from autoaccel.cst_edit import code_of
from autoaccel.convert.transforms.distributed._base import (
    DISTRIBUTED,
    DistributedStep,
    parse_statements,
)

ENDLESS = "endless_epochs"
_ENDLESS_CODE = f'''
def {ENDLESS}(loader):
    """`loader`'s batches over and over, each pass a new epoch of its sampler."""
    while True:
        if {DISTRIBUTED}:
            loader.sampler.set_epoch(loader.sampler.epoch + 1)
        yield from loader
'''


class SetSamplerEpoch(DistributedStep):
    DESCRIPTION = "Call set_epoch(epoch) on the DistributedSampler at each epoch start."
    code = "ACC105"

    def visit_Module(self, node: cst.Module) -> None:
        self.endless: set[cst.Call] = set()  # `cycle(loader)` calls: `endless_epochs(...)`
        for loop in self.script.training.step_loops.values():
            if loop.role is not LoopRole.TRAIN or not any(
                self.shards_loader(o) for o in loop.loaders
            ):
                continue
            if loop.module is self.script.module:
                if loop.node in self.train_loops():
                    self._set_epoch(loop)
            elif (
                loop.function is not None
                and _epoch_loop(loop) is None
                and not method_calls(loop.function.node.body, "set_epoch")
                and not new_passes(loop, self._program)  # its own module sets it there
            ):
                # the training function of another module, called in an epoch loop here
                sites = [s for s in self._program.calls_of(loop.function) if self._here(s)]
                if sites:
                    self._set_epoch_around(sites, loop)

    def _set_epoch(self, loop: StepLoop) -> None:
        function = self.scope_of(loop.node)
        if function is not None and method_calls(function.body, "set_epoch"):
            return  # the function that trains an epoch sets it (`train_sampler.set_epoch(epoch)`)
        if self._set_epoch_around_phases(loop):
            return
        if _epoch_loop(loop) is not None:
            self._set_epoch_around([loop.node], loop)
            return
        if self._set_epoch_on_new_pass(loop) or self._count_endless_passes(loop):
            return
        sites = self._program.calls_of(loop.function) if loop.function is not None else []
        if any(not self._here(site) for site in sites):
            return  # called from another module: its own conversion sets it there
        self._set_epoch_around(sites, loop)

    def _set_epoch_around_phases(self, loop: StepLoop) -> bool:
        """`loaders["train"].sampler.set_epoch(epoch)` at the top of the epoch loop around
        a loop over the phases (`for phase in ["train", "val"]:`) whose one training phase
        reads `loaders["train"]`. Whether it was one."""
        index = self.script.index
        phases = phases_of(loop, index) if index is not None else None
        if phases is None or len(phases.training) != 1:
            return False
        epoch_loop = next(
            (a for a in self.ancestors(phases.phase_loop) if isinstance(a, (cst.For, cst.While))),
            None,
        )
        if epoch_loop is None:
            return False
        (phase,) = phases.training
        self._insert(epoch_loop, f"{phases.holder}[{phases.keys[phase].value}]", phases.phase_loop)
        return True

    def _set_epoch_around(self, sites: Sequence[cst.CSTNode], loop: StepLoop) -> None:
        """Set the epoch at the top of the innermost `for` loop of this module around one
        of `sites` (the step loop, or calls of the function that holds it)."""
        for site in sites:
            outer = next(
                (a for a in self.ancestors(site) if isinstance(a, (cst.For, cst.While))), None
            )
            loader = self._holder(outer, loop, site) if outer is not None else None
            if loader is not None:
                self._insert(outer, loader, site)  # type: ignore[arg-type]
                return
        self.skipped(
            "set_epoch",
            "no epoch loop found around this training loop; call"
            f" `{loop.loader or 'train_loader'}.sampler.set_epoch(epoch)` (its training"
            " DataLoader's) at the start of every epoch by hand",
            loop.node if loop.module is self.script.module else sites[0],
        )

    @property
    def _program(self) -> Program:
        program = self.script.program
        assert program is not None
        return program

    def _here(self, node: cst.CSTNode) -> bool:
        return self._program.module_of.get(node) is self.script.module

    def _holder(
        self, epoch_loop: cst.For | cst.While, step: StepLoop, site: cst.CSTNode
    ) -> str | None:
        """A name that holds the training loader when `site` in `epoch_loop` runs: a
        parameter or earlier assignment of its function (before the epoch loop, or in it
        before `site`), an attribute of `self`, or a global."""
        program, loaders = self.script.program, step.loaders
        assert program is not None and self.script.module is not None
        function = self.scope_of(epoch_loop)
        info = program.functions.get(function) if function is not None else None
        candidates: list[tuple[object, str, str]] = []  # (owner, name, spelling)
        if info is not None:
            at = self.line_of(site)
            local = [p.name.value for p in info.node.params.params] + [
                name
                for target in find(info.node.body, cst.AssignTarget)
                if self.line_of(target) < at
                for name in bound_names(target.target)
            ]
            iterators = self._iterators(info.node.body)  # `batches = iter(loader)`: no sampler
            candidates += [
                (info.scope.owner(name), name, name) for name in local if name not in iterators
            ]
            if info.cls is not None:
                candidates += _attributes(program, info.cls.family, "self")
            # an attribute of an object of the project's (`trainer.train_loader` of a
            # `trainer.training(epoch)` called in the loop)
            candidates += [
                candidate
                for name in local
                if name not in iterators
                for obj in program.read((info.scope.owner(name), name))
                if obj.cls is not None
                for candidate in _attributes(program, obj.cls.family, name)
            ]
        scope = self.script.module.scope
        candidates += [(scope, name, name) for name in scope.bindings]
        holders = [
            spelling
            for owner, name, spelling in candidates
            if program.read((owner, name)) & loaders  # type: ignore[arg-type]
        ]
        if step.loader in holders:
            return step.loader
        return holders[0] if holders else None

    def _set_epoch_on_new_pass(self, loop: StepLoop) -> bool:
        """Batches drawn with `next()`, the iterator made again once the loader runs out
        (`except StopIteration: batches = iter(loader)`): each new pass is an epoch, so the
        sampler's epoch goes up by one just before it. Whether there was one."""
        passes = new_passes(loop, self._program)
        for line, loader in passes:
            sampler = f"{code_of(loader)}.sampler"
            self.before.setdefault(line, []).extend(
                parse_statements(
                    f"if {DISTRIBUTED}:\n"
                    "    # a new pass over the data: a new shuffle\n"
                    f"    {sampler}.set_epoch({sampler}.epoch + 1)\n"
                )
            )
            self.changed(line, f"`{sampler}.set_epoch(...)`: a new shuffle every pass")
        return bool(passes)

    def _count_endless_passes(self, loop: StepLoop) -> bool:
        """Batches drawn with `next()` from a generator of the project that reads the loader
        over and over (DDPM's `cycle(dl)`: `while True: for data in dl: yield data`): the
        call becomes `endless_epochs(loader)`, the same batches with each pass a new epoch
        of the sampler. Whether there was one."""
        scope = loop.function.node if loop.function is not None else self.script.index.module  # type: ignore[union-attr]
        found = False
        for call in find(scope, cst.Call):
            functions = self._program.callees.get(call, set())
            if (
                len(call.args) == 1
                and call.args[0].keyword is None
                and functions
                and all(_passes_forever(f.node) for f in functions)
                and self._program.values_of(call.args[0].value, loop.module) & loop.loaders  # type: ignore[arg-type]
            ):
                self.endless.add(call)
                self.changed(
                    call,
                    f"`{ENDLESS}(...)` in place of `{code_of(call.func)}(...)`: the same batches,"
                    " each pass over the loader a new shuffle (`sampler.set_epoch`)",
                )
                found = True
        if found:
            self.define_helper(self.script.index.module, ENDLESS, _ENDLESS_CODE)  # type: ignore[union-attr]
        return found

    def edited(self) -> list[cst.CSTNode]:
        return [*self.planned_statements(), *self.endless]

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.Call:
        if original_node not in self.endless:
            return updated_node
        return updated_node.with_changes(func=cst.Name(ENDLESS))

    def _iterators(self, body: cst.CSTNode) -> set[str]:
        """The names `body` binds to an iterator, `iter(...)`: it reads the loader's
        batches, but has no `.sampler` of its own."""
        index = self.script.index
        assert index is not None
        return {
            name
            for assign in find(body, cst.Assign)
            if _iterated(assign.value, index) is not None
            for target in assign.targets
            for name in bound_names(target.target)
        }

    def _insert(self, epoch_loop: cst.For | cst.While, loader: str, site: cst.CSTNode) -> None:
        """`loader.sampler.set_epoch(epoch)` at the top of `epoch_loop`, or right after
        the last statement of it before `site` that (re)builds `loader`; the sampler's
        own epoch plus one in a `while` loop, which counts none (pytorch-semseg's `while
        i <= train_iters:` around its pass over the loader)."""
        sampler = f"{loader}.sampler"
        counted = isinstance(epoch_loop, cst.For)
        epoch = name_key(epoch_loop.target) if counted else f"{sampler}.epoch + 1"  # type: ignore[union-attr]
        body = epoch_loop.body
        if epoch is None or not isinstance(body, cst.IndentedBlock):
            self.skipped(
                "set_epoch",
                f"call `{loader}.sampler.set_epoch(epoch)` at the start of every epoch by hand",
                epoch_loop,
            )
            return
        if method_calls(body, "set_epoch"):
            return
        statements = list(body.body)
        around = (site, *self.ancestors(site))  # (none in the body: in the loop's `else:`)
        at = next((i for i, s in enumerate(statements) if any(s is a for a in around)), 0)
        built = [i for i, s in enumerate(statements[:at]) if _binds(s, loader)]
        first = statements[built[-1] + 1] if built else statements[0]
        note = "" if counted else "    # a new pass over the data: a new shuffle\n"
        self.before.setdefault(first, []).extend(
            parse_statements(f"if {DISTRIBUTED}:\n{note}    {sampler}.set_epoch({epoch})\n")
        )
        self.changed(
            first,
            f"`{sampler}.set_epoch({epoch})`: a new shuffle every {'epoch' if counted else 'pass'}",
        )


def _passes_forever(function: cst.FunctionDef) -> bool:
    """`def cycle(dl): while True: for data in dl: yield data`: a generator that reads its
    parameter over and over, and does nothing else (but tell what it does)."""
    params = function.params.params
    body = list(function.body.body)
    if body and m.matches(body[0], m.SimpleStatementLine([m.Expr(m.SimpleString())])):
        body = body[1:]  # its docstring
    return (
        len(params) == 1
        and len(body) == 1
        and m.matches(
            body[0],
            m.While(
                test=m.Name("True"),
                body=m.IndentedBlock(
                    [
                        m.For(
                            target=m.Name(),
                            iter=m.Name(params[0].name.value),
                            body=m.IndentedBlock([m.SimpleStatementLine([m.Expr(m.Yield())])]),
                            orelse=None,
                        )
                    ]
                ),
                orelse=None,
            ),
        )
        and _yields_its_item(body[0])
    )


def _yields_its_item(loop: cst.While) -> bool:
    """The `for` of `loop` yields its own target as it is."""
    passed = loop.body.body[0]
    if not isinstance(passed, cst.For) or not isinstance(passed.target, cst.Name):
        return False
    yielded = m.findall(passed.body, m.Yield(value=m.Name(passed.target.value)))
    return len(yielded) == 1


def _binds(statement: cst.BaseStatement, key: str) -> bool:
    """Whether `statement` assigns the name or `self.` attribute `key`."""
    return any(
        name_key(target.target) == key or key in bound_names(target.target)
        for target in find(statement, cst.AssignTarget)
    )


def _attributes(program: Program, family: object, spelled: str) -> list[tuple[object, str, str]]:
    """The attributes of the objects of a class `family`, each as (owner, name,
    spelling), spelled on `spelled` (`self.train_loader`)."""
    return [
        (family, attr, f"{spelled}.{attr}")
        for (owner, attr) in program.values
        if owner is family and isinstance(attr, str)
    ]


def _epoch_loop(step: StepLoop) -> cst.For | cst.While | None:
    """The innermost loop around `step` in its own function (a `while` over training
    iterations counts: each of its passes reads the loader once more)."""
    assert step.module is not None
    for ancestor in step.module.index.ancestors(step.node):
        if isinstance(ancestor, (cst.FunctionDef, cst.Lambda, cst.ClassDef)):
            return None
        if isinstance(ancestor, (cst.For, cst.While)):
            return ancestor
    return None


# What an exhausted iterator raises, and the handlers that catch it.
_STOPS = frozenset({"builtins.StopIteration", "builtins.Exception", "builtins.BaseException"})


def new_passes(loop: StepLoop, program: Program) -> list[tuple[cst.CSTNode, cst.BaseExpression]]:
    """The lines of `except StopIteration:` handlers (or a bare `except:`, `except
    Exception:`) in `loop`'s function that make an iterator of its training loader again
    (`batches = iter(loader)`), each with that loader's expression."""
    module = loop.module
    assert module is not None
    scope = loop.function.node if loop.function is not None else loop.node
    found: list[tuple[cst.CSTNode, cst.BaseExpression]] = []
    for handler in find(scope, cst.ExceptHandler):
        caught = module.index.qualified_names(handler.type) if handler.type else _STOPS
        if not caught & _STOPS:
            continue
        for line in handler.body.body:
            for assign in find(line, cst.Assign):
                loader = _iterated(assign.value, module.index)
                if loader is not None and program.values_of(loader, module) & loop.loaders:
                    found.append((line, loader))
    return found


def _iterated(value: cst.BaseExpression, index: ModuleIndex) -> cst.BaseExpression | None:
    """`loader` of `iter(loader)` (an iterator: the loader's batches, no `.sampler`)."""
    if (
        isinstance(value, cst.Call)
        and value.args
        and "builtins.iter" in index.qualified_names(value.func)
    ):
        return value.args[0].value
    return None
