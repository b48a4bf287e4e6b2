"""What a short run of a script showed, as data: `RunFacts` (JSON in, dataclasses out).

The JSON is what `autoaccel.facts.recorder` writes in the child process::

    {"version": 1, "script": PATH, "exit": "ok" | "max-steps" | "error: ...", "steps": N,
     "seconds": S, "files": {PATH: SHA256 of the file as it ran},
     "modules":    [{"id", "cls", "site", "direct"}],          # every nn.Module made
     "optimizers": [{"id", "cls", "site", "direct", "params", "modules", "roots"}],
     "loaders" | "samplers" | "schedulers" | "scalers": [{"id", "cls", "site", "direct"}],
     "calls":    [{"kind": "backward" | "step" | "zero_grad", "site", "count", "object"}],
     "forwards": [{"module", "site", "count", "args"}],      # top-level module calls
     "writes":   [{"kind": "torch.save" | "open", "path", "site", "count"}],
     "prints":   [{"site", "count"}]}

A site is the call expression in the user's file that did it: ``{"path", "line", "col",
"end_line", "end_col"}``, lines from 1, columns as CPython's `co_positions()` gives them
(0-based UTF-8 *byte* offsets; `autoaccel.facts.resolve` turns them into characters). An
object's site is the call that made it (`Net()`, not the `super().__init__()` inside
`Net`); `direct` is False when torch made it inside another call of the user's (the
samplers a `DataLoader(...)` makes itself): its site is then that call. An optimizer's
`modules` are the ids of the modules whose parameters it holds, all of them; its `roots`
are those among them that are no submodule of another (the models it trains). `object`
of a step or zero_grad is the optimizer's id. `args` of a forward are the shapes of its
positional tensor arguments, or the type name of any other argument.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

VERSION = 1
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
                col = len(lines[self.line - 1].encode("utf-8")[: self.col].decode("utf-8", "replace"))
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


@dataclass(frozen=True)
class Called:
    """A call site of `backward`, `step` or `zero_grad`, and how often it ran."""

    kind: str
    site: Site
    count: int
    object: int | None = None  # the optimizer's id (step, zero_grad)


@dataclass(frozen=True)
class Forward:
    """A site where a module the run made was called at top level (not inside the
    forward of another module)."""

    module: int
    site: Site
    count: int
    args: tuple[Any, ...] = ()


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
            calls=[Called(c["kind"], _site(c["site"]), c["count"], c.get("object")) for c in data.get("calls", [])],
            forwards=[
                Forward(f["module"], _site(f["site"]), f["count"], tuple(map(_frozen, f.get("args", []))))
                for f in data.get("forwards", [])
            ],
            writes=[Write(w["kind"], w["path"], _site(w["site"]), w["count"]) for w in data.get("writes", [])],
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
        data["id"], data["cls"], _site(data.get("site")), data.get("direct", True),
        data.get("params", 0), tuple(data.get("modules", ())), tuple(data.get("roots", ())),
    )


def _frozen(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value
