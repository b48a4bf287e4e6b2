"""The child side of a fact run: patches that record, keyed to source positions, what the
script makes and calls (see `autoaccel.facts.model` for the JSON it writes).

It runs inside `autoaccel.run.harness` (same scratch folder and step limit): the harness
enters `FactRecorder.patches()` after its own when ``AUTOACCEL_FACTS_OUT`` names the output
file, tells it the samples of each batch a DataLoader hands out, and calls `write()` when
the script has ended. torch is imported only inside the
methods: importing this module stays cheap, and `lint` never gets here.

What it patches, and why each is cheap: the `__init__` of `nn.Module`, `Optimizer`,
`DataLoader`, the samplers, `LRScheduler` and `GradScaler` (one frame walk per object
made); `Tensor.backward` and `Optimizer.zero_grad`, and a global optimizer step pre-hook
(one frame walk per call); `DataLoader.__iter__` and the iterators' `__next__` (which
loader handed out the latest batch: a dict look-up per batch); global module forward hooks
that count the nesting depth and look at the stack only for top-level calls (and note the
shapes those got and returned);
`torch.save`, `builtins.open` and `builtins.print`. The harness's own patches, under these,
send the files written to its scratch folder.
"""

from __future__ import annotations

import builtins
import hashlib
import json
import os
import sys
import time
from contextlib import ExitStack
from pathlib import Path
from types import CodeType, FrameType
from typing import Any
from collections.abc import Callable

from autoaccel.facts.model import MAX_SEEN, VERSION
from autoaccel.facts.user_code import is_user_file, user_frame
from autoaccel.patching import patched

FACTS_ENV = "AUTOACCEL_FACTS_OUT"
_WRITE_MODES = frozenset("wax+")
MAX_ELEMENTS = 16  # a longer tuple or list argument is noted by its type only
_LOADER_ATTR = "_autoaccel_fact_loader"  # on a DataLoader's iterator: the loader's fact id
_AUTOACCEL = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "")


class FactRecorder:
    """Records facts while the patches are in place; `write(path)` saves them."""

    def __init__(self, script: str, latest_batch: Callable[[], int | None]) -> None:
        """`latest_batch`: the samples of the batch a DataLoader handed out last (the
        harness counts them), None where unknown."""
        self.script = os.path.realpath(script)
        self.started = time.perf_counter()
        self._latest_batch = latest_batch
        self._positions: dict[CodeType, list[tuple]] = {}
        self._ids: dict[int, tuple[str, int]] = {}  # id(obj) -> (kind, fact id)
        self._objects: dict[str, list[tuple[Any, dict[str, Any]]]] = {
            kind: []
            for kind in ("modules", "optimizers", "loaders", "samplers", "schedulers", "scalers")
        }
        self._counted: dict[tuple, dict[str, Any]] = {}  # (kind, site..., object) -> entry
        self.calls: list[dict[str, Any]] = []
        self.forwards: list[dict[str, Any]] = []
        self.writes: list[dict[str, Any]] = []
        self.prints: list[dict[str, Any]] = []
        self._batches: dict[int, int] = {}  # loader's fact id -> batches it handed out
        self._latest_loader: int | None = None  # the loader that handed out the latest batch
        self._trains: set[int] = set()  # loaders whose latest batch a backward() followed
        self._depth = 0  # module forwards under way
        self._under_way: tuple[dict[str, Any], int | None, list[Any]] | None = (
            None  # the top-level forward under way
        )

    # -- where ----------------------------------------------------------------------------
    def _is_ours(self, frame: FrameType) -> bool:
        """A frame of autoaccel's own wrappers (the harness's patches)."""
        return frame.f_code.co_filename.startswith(_AUTOACCEL)

    def _site_of(self, frame: FrameType) -> dict[str, Any]:
        code = frame.f_code
        positions = self._positions.get(code)
        if positions is None:
            positions = self._positions[code] = list(code.co_positions())
        line, end_line, col, end_col = positions[frame.f_lasti // 2]
        return {
            "path": os.path.realpath(code.co_filename),
            "line": line,
            "col": col,
            "end_line": end_line,
            "end_col": end_col,
        }

    def _caller_site(self, depth: int = 2) -> dict[str, Any] | None:
        frame = user_frame(sys._getframe(depth))
        return None if frame is None else self._site_of(frame)

    def _creation(self, obj: Any) -> tuple[dict[str, Any] | None, bool]:
        """The site of the call that made `obj`: the frame that called its outermost
        `__init__` (or the first frame of the user's above it), and whether that frame
        was the user's own (not torch making it inside another call)."""
        frame: FrameType | None = sys._getframe(2)
        while frame is not None and (_initialises(frame, obj) or self._is_ours(frame)):
            frame = frame.f_back
        if frame is None:
            return None, True
        user = user_frame(frame)
        return (None if user is None else self._site_of(user)), is_user_file(
            frame.f_code.co_filename
        )

    # -- objects --------------------------------------------------------------------------
    def _made(self, kind: str) -> Callable[[Callable], Callable]:
        def make(original: Callable) -> Callable:
            def init(obj, *args, **kwargs):
                result = original(obj, *args, **kwargs)
                if id(obj) not in self._ids:
                    site, direct = self._creation(obj)
                    number = len(self._ids) + 1
                    self._ids[id(obj)] = (kind, number)
                    entry = {"id": number, "cls": _class_name(obj), "site": site, "direct": direct}
                    self._objects[kind].append((obj, entry))
                return result

            return init

        return make

    def _fact_id(self, obj: Any) -> int | None:
        known = self._ids.get(id(obj))
        return None if known is None else known[1]

    # -- calls ----------------------------------------------------------------------------
    def _count(
        self, store: list[dict[str, Any]], key: tuple, make: Callable[[], dict[str, Any]]
    ) -> None:
        entry = self._counted.get(key)
        if entry is None:
            entry = self._counted[key] = make()
            store.append(entry)
        entry["count"] += 1

    def _call(self, kind: str, obj: Any, frame: FrameType | None) -> None:
        user = user_frame(frame)
        if user is None:
            return
        site = self._site_of(user)
        number = None if obj is None else self._fact_id(obj)
        key = (kind, *site.values(), number)
        self._count(
            self.calls, key, lambda: {"kind": kind, "site": site, "count": 0, "object": number}
        )

    def _backward(self, original: Callable) -> Callable:
        def backward(tensor, *args, **kwargs):
            self._call("backward", None, sys._getframe(1))
            if self._latest_loader is not None:
                self._trains.add(self._latest_loader)
            return original(tensor, *args, **kwargs)

        return backward

    def _zero_grad(self, original: Callable) -> Callable:
        def zero_grad(optimizer, *args, **kwargs):
            self._call("zero_grad", optimizer, sys._getframe(1))
            return original(optimizer, *args, **kwargs)

        return zero_grad

    def _step_hook(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self._call("step", optimizer, sys._getframe(1))

    def _forward_pre_hook(self, module: Any, args: Any) -> None:
        self._depth += 1
        if self._depth != 1:
            return
        number = self._fact_id(module)
        user = user_frame(sys._getframe(1))
        self._under_way = None
        if number is None or user is None:
            return
        site = self._site_of(user)
        key = ("forward", *site.values(), number)
        shapes = [_shape(a) for a in args]
        self._count(
            self.forwards,
            key,
            lambda: {"module": number, "site": site, "count": 0, "args": shapes, "seen": []},
        )
        self._under_way = (self._counted[key], self._latest_batch(), shapes)

    def _forward_hook(self, module: Any, args: Any, output: Any) -> None:
        self._depth = max(0, self._depth - 1)
        if self._depth == 0 and self._under_way is not None:
            entry, batch, shapes = self._under_way
            self._under_way = None
            outputs = (
                [_shape(o) for o in output]
                if isinstance(output, (tuple, list))
                else [_shape(output)]
            )
            _note(entry["seen"], {"batch": batch, "args": shapes, "outputs": outputs})

    # -- batches --------------------------------------------------------------------------
    def _iter(self, original: Callable) -> Callable:
        def iterate(loader):
            iterator = original(loader)
            vars(iterator)[_LOADER_ATTR] = self._fact_id(loader)
            return iterator

        return iterate

    def _next(self, original: Callable) -> Callable:
        def next_batch(iterator):
            batch = original(iterator)
            number = vars(iterator).get(_LOADER_ATTR)
            self._latest_loader = number
            if number is not None:
                self._batches[number] = self._batches.get(number, 0) + 1
            return batch

        return next_batch

    # -- writes and prints ----------------------------------------------------------------
    def _save(self, original: Callable) -> Callable:
        def save(obj, f, *args, **kwargs):
            user = user_frame(sys._getframe(1))
            if user is not None:
                path = os.fspath(f) if isinstance(f, (str, os.PathLike)) else repr(f)
                self._write("torch.save", path, self._site_of(user))
            return original(obj, f, *args, **kwargs)

        return save

    def _write(self, kind: str, path: str, site: dict[str, Any]) -> None:
        key = (kind, path, *site.values())
        self._count(
            self.writes, key, lambda: {"kind": kind, "path": path, "site": site, "count": 0}
        )

    def _open(self, original: Callable) -> Callable:
        def open_(file, mode="r", *args, **kwargs):
            user = sys._getframe(1)
            # only the script's own opens of a path for writing: torch, the stdlib and pip
            # open theirs (the harness under these patches sends the file to its scratch folder)
            if (
                is_user_file(user.f_code.co_filename)
                and isinstance(file, (str, os.PathLike))
                and _WRITE_MODES & set(mode)
            ):
                self._write("open", os.fspath(file), self._site_of(user))
            return original(file, mode, *args, **kwargs)

        return open_

    def _print(self, original: Callable) -> Callable:
        def print_(*args, **kwargs):
            frame = sys._getframe(1)
            if is_user_file(frame.f_code.co_filename):
                site = self._site_of(frame)
                self._count(
                    self.prints, ("print", *site.values()), lambda: {"site": site, "count": 0}
                )
            return original(*args, **kwargs)

        return print_

    # -- patches --------------------------------------------------------------------------
    def patches(self) -> ExitStack:
        import torch
        from torch.optim.optimizer import register_optimizer_step_pre_hook
        from torch.nn.modules.module import (
            register_module_forward_hook,
            register_module_forward_pre_hook,
        )
        from torch.utils.data import DataLoader, dataloader, sampler

        stack = ExitStack()
        stack.enter_context(patched(torch.nn.Module, "__init__", self._made("modules")))
        stack.enter_context(patched(torch.optim.Optimizer, "__init__", self._made("optimizers")))
        stack.enter_context(patched(DataLoader, "__init__", self._made("loaders")))
        stack.enter_context(patched(DataLoader, "__iter__", self._iter))
        stack.enter_context(patched(dataloader._BaseDataLoaderIter, "__next__", self._next))
        samplers = [
            cls
            for cls in vars(sampler).values()
            if isinstance(cls, type)
            and issubclass(cls, sampler.Sampler)
            and "__init__" in vars(cls)
        ]
        from torch.utils.data.distributed import DistributedSampler

        for cls in {*samplers, DistributedSampler}:
            stack.enter_context(patched(cls, "__init__", self._made("samplers")))
        stack.enter_context(
            patched(torch.optim.lr_scheduler.LRScheduler, "__init__", self._made("schedulers"))
        )
        stack.enter_context(patched(torch.amp.GradScaler, "__init__", self._made("scalers")))
        stack.enter_context(patched(torch.Tensor, "backward", self._backward))
        stack.enter_context(patched(torch.optim.Optimizer, "zero_grad", self._zero_grad))
        stack.callback(register_optimizer_step_pre_hook(self._step_hook).remove)
        stack.callback(register_module_forward_pre_hook(self._forward_pre_hook).remove)
        stack.callback(register_module_forward_hook(self._forward_hook, always_call=True).remove)
        stack.enter_context(patched(torch, "save", self._save))
        stack.enter_context(patched(builtins, "open", self._open))
        stack.enter_context(patched(builtins, "print", self._print))
        return stack

    # -- the record -----------------------------------------------------------------------
    def facts(self, exit_status: str, steps: int) -> dict[str, Any]:
        """The JSON of the facts (see `autoaccel.facts.model`)."""
        optimizers = []
        module_params = [
            (entry["id"], obj, {id(p) for p in obj.parameters()})
            for obj, entry in self._objects["modules"]
        ]
        for optimizer, entry in self._objects["optimizers"]:
            held = {id(p) for group in optimizer.param_groups for p in group["params"]}
            owners = [
                (number, obj) for number, obj, params in module_params if params and params <= held
            ]
            inner = {id(sub) for _, obj in owners for sub in obj.modules() if sub is not obj}
            optimizers.append(
                {
                    **entry,
                    "params": len(held),
                    "modules": [n for n, _ in owners],
                    "roots": [n for n, obj in owners if id(obj) not in inner],
                }
            )
        made = {kind: [entry for _, entry in items] for kind, items in self._objects.items()}
        made["optimizers"] = optimizers
        made["loaders"] = [
            {
                **entry,
                "batches": self._batches.get(entry["id"], 0),
                "trains": entry["id"] in self._trains,
            }
            for entry in made["loaders"]
        ]
        record = {
            "version": VERSION,
            "script": self.script,
            "exit": exit_status,
            "steps": steps,
            "seconds": round(time.perf_counter() - self.started, 3),
            **made,
            "calls": self.calls,
            "forwards": self.forwards,
            "writes": self.writes,
            "prints": self.prints,
        }
        record["files"] = _digests(record)
        return record

    def write(self, path: Path, exit_status: str, steps: int) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.facts(exit_status, steps)), encoding="utf-8")


def _initialises(frame: FrameType, obj: Any) -> bool:
    """Whether `frame` runs an `__init__` of `obj` (its own, or a base class's)."""
    code = frame.f_code
    if code.co_name != "__init__" or not code.co_argcount:
        return False
    return frame.f_locals.get(code.co_varnames[0]) is obj


def _class_name(obj: Any) -> str:
    cls = type(obj)
    return f"{cls.__module__}.{cls.__qualname__}"


def _shape(value: Any) -> Any:
    if isinstance(value, (tuple, list)) and len(value) <= MAX_ELEMENTS:
        return [_shape(v) for v in value]  # what a tuple holds: `nn.DataParallel` splits each
    shape = getattr(value, "shape", None)
    return list(shape) if shape is not None and not callable(shape) else type(value).__name__


def _note(seen: list[dict[str, Any]], group: dict[str, Any]) -> None:
    """Count a call in its group of `seen` (a new one while there are fewer than `MAX_SEEN`)."""
    for known in seen:
        if all(known[k] == v for k, v in group.items()):
            known["count"] += 1
            return
    if len(seen) < MAX_SEEN:
        seen.append({**group, "count": 1})


def _digests(record: dict[str, Any]) -> dict[str, str]:
    """The sha256 of each file a site is in, as it was when it ran."""
    paths: set[str] = set()

    def collect(value: Any) -> None:
        if isinstance(value, dict):
            if {"path", "line", "col"} <= value.keys():
                paths.add(value["path"])
            for item in value.values():
                collect(item)
        elif isinstance(value, list):
            for item in value:
                collect(item)

    collect(record)
    digests = {}
    for path in sorted(paths):
        try:
            digests[path] = hashlib.sha256(Path(path).read_bytes()).hexdigest()
        except OSError:
            continue
    return digests


def recorder_from_env(
    script: str, latest_batch: Callable[[], int | None]
) -> tuple[FactRecorder, Path] | None:
    """A recorder and where it writes, when ``AUTOACCEL_FACTS_OUT`` asks for one."""
    out = os.environ.get(FACTS_ENV)
    if not out:
        return None
    return FactRecorder(script, latest_batch), Path(out)
