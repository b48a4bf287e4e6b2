"""From the positions a fact run recorded to the LibCST nodes of a module, so that rules
and transforms ask node-keyed questions ("which `Call` made the model the stepping
optimizer trains?", "which nodes call `backward()`?") instead of re-deriving them.

CPython's positions count UTF-8 *bytes* from 0 (`co_positions()`), LibCST's count
characters: a site is turned into characters with the text of the file as it ran (its
digest is in the facts; a file changed since is not resolved at all). In a conversion the
steps hand each other rewritten trees: `FactsResolver` then takes the tree's own positions
and `original_line`, which maps a line of the tree's text back to the original file, and
matches a site by its line there and by the code of the call (which column it is at may
have moved).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Iterator
from itertools import chain
from pathlib import Path

import libcst as cst
from libcst.metadata import CodeRange, MetadataWrapper, PositionProvider

from autoaccel.facts.model import (
    OBJECT_KINDS,
    BatchFirst,
    Forward,
    Made,
    RunFacts,
    Seen,
    Site,
    batch_first,
)

_NO_CODE = cst.Module([])


def _real(path: str | Path) -> str:
    return os.path.realpath(os.fspath(path))


class FactsResolver:
    """The nodes of `module` (the file at `path`, whose original text is `source`) that
    the sites of `facts` name. `positions` and `original_line` (see the module docstring)
    default to LibCST's `PositionProvider` over `module` and the identity: a module parsed
    from `source` itself."""

    def __init__(
        self,
        facts: RunFacts,
        path: str | Path,
        module: cst.Module,
        source: str | None = None,
        positions: Callable[[cst.CSTNode], CodeRange] | None = None,
        original_line: Callable[[int], int] | None = None,
    ) -> None:
        self.facts = facts
        self.path = _real(path)
        self.module = module
        self.source = module.code if source is None else source
        digest = hashlib.sha256(self.source.encode("utf-8")).hexdigest()
        recorded = facts.files.get(self.path)
        # The facts speak of this text only when the file ran as it is now (a file with a
        # BOM or another encoding than UTF-8 is compared on its decoded text, so it must
        # have been recorded from a path with no digest mismatch: then nothing resolves).
        self.current = recorded is not None and recorded == digest
        self._lines = self.source.splitlines(keepends=True)
        self._positions = positions
        self._original_line = original_line or (lambda line: line)
        self._index: dict[int, list[tuple[cst.Call, CodeRange]]] | None = None
        self._other_files: dict[str, list[str]] = {}

    # -- positions ------------------------------------------------------------------------
    def _calls_by_line(self) -> dict[int, list[tuple[cst.Call, CodeRange]]]:
        if self._index is None:
            index: dict[int, list[tuple[cst.Call, CodeRange]]] = {}
            for node in _calls(self.module):
                where = self._position(node)
                index.setdefault(self._original_line(where.start.line), []).append((node, where))
            self._index = index
        return self._index

    def _position(self, node: cst.CSTNode) -> CodeRange:
        if self._positions is None:
            resolved = MetadataWrapper(self.module, unsafe_skip_copy=True).resolve(PositionProvider)
            self._positions = resolved.__getitem__
        return self._positions(node)

    def char_column(self, line: int, byte_col: int, lines: list[str] | None = None) -> int:
        """The character column of a UTF-8 byte offset on `line` (1-based) of the source (or
        of `lines`, another file's)."""
        lines = self._lines if lines is None else lines
        if not 0 < line <= len(lines):
            return byte_col
        return len(lines[line - 1].encode("utf-8")[:byte_col].decode("utf-8", "replace"))

    def _lines_of(self, path: str) -> list[str]:
        """The lines of the file at `path` as it ran: this module's, or another file's read
        from disk when its digest is the recorded one (none when it changed since)."""
        if _real(path) == self.path:
            return self._lines
        if path not in self._other_files:
            try:
                data = Path(path).read_bytes()
                same = hashlib.sha256(data).hexdigest() == self.facts.files.get(path)
                text = data.decode("utf-8") if same else ""
            except (OSError, UnicodeDecodeError):
                text = ""
            self._other_files[path] = text.splitlines(keepends=True)
        return self._other_files[path]

    def text_of(self, site: Site) -> str:
        """The code of the call at `site` in the original source of its file."""
        lines = self._lines_of(site.path)
        start = self.char_column(site.line, site.col, lines)
        end = self.char_column(site.end_line, site.end_col, lines)
        if site.line == site.end_line:
            return lines[site.line - 1][start:end] if site.line <= len(lines) else ""
        parts = [lines[site.line - 1][start:]] if site.line <= len(lines) else []
        parts += lines[site.line : site.end_line - 1]
        parts.append(lines[site.end_line - 1][:end] if site.end_line <= len(lines) else "")
        return "".join(parts)

    def shown(self, site: Site | None) -> str:
        """`file:line:col` of `site` (a 1-based character column where its file is known)."""
        if site is None:
            return "an unknown place"
        return site.shown("".join(self._lines_of(site.path)) or None, Path.cwd())

    # -- sites to nodes -------------------------------------------------------------------
    def node_at(self, site: Site | None) -> cst.Call | None:
        """The `Call` at `site`, when `site` is in this module (None otherwise)."""
        if site is None or not self.current or _real(site.path) != self.path:
            return None
        candidates = self._calls_by_line().get(site.line, [])
        col, end_col = self.char_column(site.line, site.col), self.char_column(
            site.end_line, site.end_col
        )
        exact = [
            node
            for node, where in candidates
            if (where.start.column, where.end.line - where.start.line, where.end.column)
            == (col, site.end_line - site.line, end_col)
        ]
        text = self.text_of(site)
        same_code = [(node, where) for node, where in candidates if _code(node) == text]
        if exact and (not same_code or exact[0] in {n for n, _ in same_code}):
            return exact[0]
        if not same_code:
            return None
        return min(same_code, key=lambda item: abs(item[1].start.column - col))[0]

    def creation_call(self, made: Made) -> cst.Call | None:
        """The call that made `made`, when it is in this module."""
        return self.node_at(made.site)

    # -- questions ------------------------------------------------------------------------
    def ran_within(self, node: cst.CSTNode) -> bool:
        """Whether the run recorded anything at a site on the lines of `node` (an object
        made, a call, a forward, a write, a print); True where it cannot tell (the file
        changed since it ran). (The facts hold a file's digest when a site is in it.)"""
        if self.path not in self.facts.files:
            return False
        if not self.current:
            return True
        where = self._position(node)
        first = self._original_line(where.start.line)
        last = self._original_line(where.end.line)
        return any(
            first <= site.line <= last and _real(site.path) == self.path
            for site in _sites(self.facts)
        )

    def trained_models(self) -> list[Made]:
        return self.facts.trained_modules()

    def trained_model_calls(self) -> list[cst.Call]:
        """The calls of this module that made the models the stepping optimizers train
        ("which Call made the module whose parameters the optimizer holds?")."""
        found = (self.creation_call(model) for model in self.trained_models())
        return [node for node in found if node is not None]

    def calls_of(self, kind: str) -> list[cst.Call]:
        """The calls of this module that ran `backward`, `step` or `zero_grad`."""
        found = (self.node_at(site) for site in self.facts.sites(kind))
        return list(dict.fromkeys(node for node in found if node is not None))

    def forwards_at(self, node: cst.Call) -> list[Forward]:
        """The top-level module calls the run made at `node`."""
        return [f for f in self.facts.forwards if self.node_at(f.site) is node]

    def argument_batch_first(self, node: cst.Call, index: int) -> BatchFirst:
        """Whether the positional argument `index` of the call `node` was batch-first on
        every call the run made there (`autoaccel.facts.model.batch_first`)."""
        return self._batch_first(node, lambda seen: _item(seen.args, index))

    def output_batch_first(self, node: cst.Call, index: int) -> BatchFirst:
        """The same for the element `index` of the tuple the call `node` returned."""
        return self._batch_first(node, lambda seen: _item(seen.outputs, index))

    def _batch_first(self, node: cst.Call, pick: Callable[[Seen], object]) -> BatchFirst:
        forwards = self.forwards_at(node)
        if not forwards:
            return BatchFirst(None, f"the run never called `{_code(node)}`")
        return batch_first(forwards, pick)

    def trained_at(self, node: cst.Call) -> list[Made]:
        """The trained models whose forward ran at the call `node`."""
        called = {f.module for f in self.forwards_at(node)}
        return [model for model in self.trained_models() if model.id in called]

    def made_at(self, node: cst.Call) -> list[Made]:
        """The objects (modules, optimizers, loaders, ...) made by the call `node`."""
        kinds = (
            self.facts.modules,
            self.facts.optimizers,
            self.facts.loaders,
            self.facts.samplers,
            self.facts.schedulers,
            self.facts.scalers,
        )
        return [made for items in kinds for made in items if self.node_at(made.site) is node]


def _calls(module: cst.Module) -> list[cst.Call]:
    found: list[cst.Call] = []

    class _Calls(cst.CSTVisitor):
        def visit_Call(self, node: cst.Call) -> None:
            found.append(node)

    module.visit(_Calls())
    return found


def _sites(facts: RunFacts) -> Iterator[Site]:
    """Every site the run recorded."""
    made: list[Made] = [m for kind in OBJECT_KINDS for m in getattr(facts, kind)]
    sites = chain(
        (m.site for m in made),
        (c.site for c in facts.calls),
        (f.site for f in facts.forwards),
        (w.site for w in facts.writes),
        (p.site for p in facts.prints),
    )
    return (site for site in sites if site is not None)


def _item(values: tuple, index: int) -> object:
    return values[index] if index < len(values) else None


def _code(node: cst.Call) -> str:
    """The code of a call without the parentheses around it (CPython's positions
    leave them out)."""
    return _NO_CODE.code_for_node(node.with_changes(lpar=(), rpar=()))


class ConversionFacts:
    """The facts of a run of the script a conversion converts (`path`, whose text was
    `source`), for its steps: `history` is the pipeline's list of (before, after) texts of
    the steps that changed the module, which maps the lines of a later tree back to
    `source` (`autoaccel.diff.original_line`). The other modules of the script's project
    are `track`ed alike."""

    def __init__(self, facts: RunFacts, path: str | Path, source: str) -> None:
        self.facts = facts
        self.path = _real(path)
        self.source = source
        self.history: list[tuple[str, str]] = []
        self._modules: dict[str, tuple[str, list[tuple[str, str]]]] = {}
        self._resolvers: dict[int, tuple[cst.Module, FactsResolver]] = {}
        self._elsewhere: dict[int, tuple[cst.Module, FactsResolver]] = {}

    def track(self, path: str | Path, source: str, history: list[tuple[str, str]]) -> None:
        """Resolve the sites of another module of the project (at `path`, whose text was
        `source` when the script ran) in the trees of its conversion, whose `history` the
        pipeline extends."""
        self._modules[_real(path)] = (source, history)

    def resolver(
        self,
        tree: cst.Module,
        positions: Callable[[cst.CSTNode], CodeRange],
        path: str | Path | None = None,
    ) -> FactsResolver:
        """The resolver for `tree`, a step's input: of the script, or of the `track`ed
        module at `path` (made once per tree)."""
        kept = self._resolvers.get(id(tree))
        if kept is not None and kept[0] is tree:
            # (positions of this step: the step that made it may have ended its pass)
            kept[1]._positions = positions
            return kept[1]
        from autoaccel.diff import original_line

        real = self.path if path is None else _real(path)
        if real == self.path:
            source, history = self.source, list(self.history)
        else:  # (an untracked module: its text is not the one that ran, nothing resolves)
            source, history = self._modules.get(real, ("", []))
            history = list(history)
        resolver = FactsResolver(
            self.facts,
            real,
            tree,
            source,
            positions,
            lambda line: original_line(history, line),
        )
        self._resolvers = {id(tree): (tree, resolver)}  # the previous trees are gone
        return resolver

    def resolver_in(self, path: str | Path, tree: cst.Module) -> FactsResolver:
        """The resolver for `tree`, another module of the script's project (at `path`):
        its sites resolve only while its text is the file as it ran (a module the
        conversion has rewritten resolves nothing). Made once per tree."""
        kept = self._elsewhere.get(id(tree))
        if kept is not None and kept[0] is tree:
            return kept[1]
        resolver = FactsResolver(self.facts, path, tree)
        self._elsewhere[id(tree)] = (tree, resolver)
        return resolver
