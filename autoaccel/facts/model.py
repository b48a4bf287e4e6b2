"""What a short run of a script showed, as data: `RunFacts` (JSON in, dataclasses out).

The JSON is what `autoaccel.facts.recorder` writes in the child process::

    {"version": 1, "script": PATH, "exit": "ok" | "max-steps" | "error: ...", "steps": N,
     "seconds": S, "files": {PATH: SHA256 of the file as it ran},
     "modules":    [{"id", "cls", "site", "direct"}],          # every nn.Module made
     "optimizers": [{"id", "cls", "site", "direct", "params", "modules", "roots"}],
     "loaders":    [{"id", "cls", "site", "direct", "batches", "trains"}],
     "samplers" | "schedulers" | "scalers": [{"id", "cls", "site", "direct"}],
     "calls":    [{"kind": "backward" | "step" | "zero_grad", "site", "count", "object"}],
     "forwards": [{"module", "site", "count", "args", "seen"}],  # top-level module calls
     "writes":   [{"kind": "torch.save" | "open", "path", "site", "count"}],
     "prints":   [{"site", "count"}]}

A site is the call expression in the user's file that did it: ``{"path", "line", "col",
"end_line", "end_col"}``, lines from 1, columns as CPython's `co_positions()` gives them
(0-based UTF-8 *byte* offsets; `autoaccel.facts.resolve` turns them into characters). An
object's site is the call that made it (`Net()`, not the `super().__init__()` inside
`Net`); `direct` is False when torch made it inside another call of the user's (the
samplers a `DataLoader(...)` makes itself): its site is then that call. An optimizer's
`modules` are the ids of the modules whose parameters it holds, all of them; its `roots`
are those among them that are no submodule of another (the models it trains). A loader's
`batches` counts the batches its iterators handed out, and `trains` is true when a
`backward()` ran while the latest batch handed out (of any loader) was one of its own.
`object` of a step or zero_grad is the optimizer's id. `args` of a forward are the shapes of its
positional tensor arguments, or the type name of any other argument, at its first call;
`seen` groups its calls by what they saw: ``[{"batch", "args", "outputs", "count"}]``, at
most `MAX_SEEN` groups (their counts then add up to less than the forward's), where
`batch` is the number of samples of the latest batch a DataLoader had handed out (null: none
yet, or one whose samples cannot be counted) and `outputs` the shapes of a tuple's (or
list's) elements, or of the one output.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

VERSION = 1
MAX_SEEN = 8  # groups of calls kept per forward site
OBJECT_KINDS = ("modules", "optimizers", "loaders", "samplers", "schedulers", "scalers")


@dataclass(frozen=True)
class Site:
    """A call expression in a file (columns: UTF-8 byte offsets, 0-based)."""

    path: str
    line: int
    col: int
    end_line: int
    end_col: int

    def __str__(self) -> str:
        return f"{self.path}:{self.line}:{self.col + 1}"

    def shown(self, source: str | None = None, relative_to: Path | None = None) -> str:
        """`file:line:col` with a 1-based *character* column (`source`: the file's text)."""
        path = self.path
        if relative_to is not None:
            try:
                path = str(Path(path).relative_to(relative_to))
            except ValueError:
                pass
        col = self.col
        if source is not None:
            lines = source.splitlines()
            if 0 < self.line <= len(lines):
                col = len(
                    lines[self.line - 1].encode("utf-8")[: self.col].decode("utf-8", "replace")
                )
        return f"{path}:{self.line}:{col + 1}"


@dataclass(frozen=True)
class Made:
    """An object the run made: a module, optimizer, loader, sampler, scheduler, scaler."""

    id: int
    cls: str
    site: Site | None
    direct: bool = True
    # optimizers only: how many parameters, the modules they belong to, and the roots
    params: int = 0
    modules: tuple[int, ...] = ()
    roots: tuple[int, ...] = ()
    # loaders only: how many batches it handed out, and whether one fed a backward()
    batches: int = 0
    trains: bool = False


@dataclass(frozen=True)
class Called:
    """A call site of `backward`, `step` or `zero_grad`, and how often it ran."""

    kind: str
    site: Site
    count: int
    object: int | None = None  # the optimizer's id (step, zero_grad)


@dataclass(frozen=True)
class Seen:
    """Calls at a forward site that saw the same shapes: the samples of the step's batch
    (None: unknown), the shapes of the positional arguments and of the outputs."""

    batch: int | None
    args: tuple[Any, ...]
    outputs: tuple[Any, ...]
    count: int


@dataclass(frozen=True)
class Forward:
    """A site where a module the run made was called at top level (not inside the
    forward of another module)."""

    module: int
    site: Site
    count: int
    args: tuple[Any, ...] = ()
    seen: tuple[Seen, ...] = ()


@dataclass(frozen=True)
class BatchFirst:
    """What the run showed about a value at a call site: `known` True (batch-first), False
    (not), None (it cannot tell), and `why`, in words."""

    known: bool | None
    why: str


def batch_first(forwards: Sequence[Forward], pick: Callable[[Seen], Any]) -> BatchFirst:
    """Whether the value `pick` takes from each group of calls (an argument's or an
    output's shape) is batch-first at the site of `forwards`: split along dimension 0,
    each part of it goes with the same samples as the parts of the batch.

    The rule: on every call recorded at the site,
    1. the step's batch is known: a DataLoader had handed out a batch, whose samples are
       counted as the dataset indices its batch sampler drew (whatever its `collate_fn`
       made of them, and the last, smaller batch as what it is);
    2. the value is a tensor whose dimension 0 is that number of samples;
    3. dimension 0 is the only one that is, on every call: a sequence-first `[len, batch]`
       tensor whose `len` equals the batch size on every call is ambiguous. Calls with two
       batch sizes (a last, smaller batch) tell a dimension that only happens to equal the
       batch size apart; a run of a few steps mostly sees one, and then no other
       dimension may equal it.
    Where 2 fails on a call, the value is not batch-first (False); where 1 or 3 fails, or
    calls went unrecorded (more than `MAX_SEEN` groups), the facts cannot tell (None).
    Not seen with one batch size: a dimension 0 of fixed size that equals the batch size
    by chance (as many classes as samples). `--to dp` asks only about values computed
    from the batch (a `.view(-1, k)` of it) or that a trained model returns from it.
    """
    seen = [group for forward in forwards for group in forward.seen]
    calls = sum(forward.count for forward in forwards)
    if not seen or sum(group.count for group in seen) != calls:
        return BatchFirst(None, "the run did not record every call here")
    shapes = [(group.batch, pick(group)) for group in seen]
    if any(batch is None for batch, _ in shapes):
        return BatchFirst(
            None, "a call ran with no DataLoader batch whose samples could be counted"
        )
    if any(not isinstance(shape, tuple) or not shape for _, shape in shapes):
        return BatchFirst(None, "a call got no tensor with a dimension there")
    for batch, shape in shapes:
        if shape[0] != batch:
            return BatchFirst(False, f"shape {list(shape)} in a step of {batch} samples")
    ranks = {len(shape) for _, shape in shapes}
    others = [d for d in range(1, min(ranks)) if all(shape[d] == batch for batch, shape in shapes)]
    shown = ", ".join(sorted({f"{list(shape)} with {batch} samples" for batch, shape in shapes}))
    if len(ranks) > 1 or others:
        return BatchFirst(None, f"shape {shown}: which dimension is the batch is ambiguous")
    return BatchFirst(True, f"dimension 0 is the batch on all {calls} calls (shape {shown})")


@dataclass(frozen=True)
class Write:
    kind: str  # "torch.save" | "open"
    path: str
    site: Site
    count: int


@dataclass(frozen=True)
class Printed:
    site: Site
    count: int


@dataclass
class RunFacts:
    script: str
    exit: str
    steps: int
    seconds: float = 0.0
    files: dict[str, str] = field(default_factory=dict)  # path -> sha256 as it ran
    modules: list[Made] = field(default_factory=list)
    optimizers: list[Made] = field(default_factory=list)
    loaders: list[Made] = field(default_factory=list)
    samplers: list[Made] = field(default_factory=list)
    schedulers: list[Made] = field(default_factory=list)
    scalers: list[Made] = field(default_factory=list)
    calls: list[Called] = field(default_factory=list)
    forwards: list[Forward] = field(default_factory=list)
    writes: list[Write] = field(default_factory=list)
    prints: list[Printed] = field(default_factory=list)

    # -- loading ------------------------------------------------------------------------
    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RunFacts:
        if data.get("version") != VERSION:
            raise ValueError(f"facts of version {data.get('version')!r}, expected {VERSION}")
        made = {kind: [_made(item) for item in data.get(kind, [])] for kind in OBJECT_KINDS}
        return cls(
            script=data["script"],
            exit=data["exit"],
            steps=data["steps"],
            seconds=data.get("seconds", 0.0),
            files=dict(data.get("files", {})),
            calls=[
                Called(c["kind"], _site(c["site"]), c["count"], c.get("object"))
                for c in data.get("calls", [])
            ],
            forwards=[_forward(f) for f in data.get("forwards", [])],
            writes=[
                Write(w["kind"], w["path"], _site(w["site"]), w["count"])
                for w in data.get("writes", [])
            ],
            prints=[Printed(_site(p["site"]), p["count"]) for p in data.get("prints", [])],
            **made,
        )

    @classmethod
    def load(cls, path: Path) -> RunFacts:
        return cls.from_json(json.loads(Path(path).read_text(encoding="utf-8")))

    # -- questions ----------------------------------------------------------------------
    @property
    def ran_steps(self) -> bool:
        """Whether the run got as far as a training step (a finished or stopped run)."""
        return self.steps > 0 and not self.exit.startswith("error")

    def module(self, module_id: int) -> Made | None:
        return next((m for m in self.modules if m.id == module_id), None)

    def stepping_optimizers(self) -> list[Made]:
        """The optimizers whose `step()` ran."""
        stepped = {c.object for c in self.calls if c.kind == "step"}
        return [o for o in self.optimizers if o.id in stepped]

    def trained_modules(self) -> list[Made]:
        """The models the stepping optimizers train: the root modules whose parameters
        they hold, in the order they were made."""
        roots = {r for o in self.stepping_optimizers() for r in o.roots}
        return [m for m in self.modules if m.id in roots]

    def forwards_of(self, module_id: int) -> list[Forward]:
        return [f for f in self.forwards if f.module == module_id]

    def sites(self, kind: str) -> list[Site]:
        """The sites of `backward`, `step` or `zero_grad` calls."""
        return [c.site for c in self.calls if c.kind == kind]

    def in_file(self, path: str | Path) -> bool:
        return str(Path(path).resolve()) in self.files


def _site(data: dict[str, Any] | None) -> Site | None:  # type: ignore[return]
    if data is None:
        return None
    return Site(data["path"], data["line"], data["col"], data["end_line"], data["end_col"])


def _made(data: dict[str, Any]) -> Made:
    return Made(
        data["id"],
        data["cls"],
        _site(data.get("site")),
        data.get("direct", True),
        data.get("params", 0),
        tuple(data.get("modules", ())),
        tuple(data.get("roots", ())),
        data.get("batches", 0),
        data.get("trains", False),
    )


def _forward(data: dict[str, Any]) -> Forward:
    seen = tuple(
        Seen(s["batch"], _frozen(s["args"]), _frozen(s["outputs"]), s["count"])
        for s in data.get("seen", [])
    )
    return Forward(
        data["module"], _site(data["site"]), data["count"], _frozen(data.get("args", [])), seen
    )


def _frozen(value: Any) -> Any:
    """A JSON list as a tuple, nested lists (shapes) too."""
    return tuple(map(_frozen, value)) if isinstance(value, list) else value
