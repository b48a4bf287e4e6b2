"""One cheap pass over a module: every node's parent and scope, and what names mean.

LibCST's `ScopeProvider` + `QualifiedNameProvider` + `ParentNodeProvider` cost three
visitor traversals (~0.4 s on a 500-line script); this walks the dataclass fields of
the tree once (~0.03 s). It resolves the names the rules ask about, those bound by
imports or builtins, with LibCST's rules: the same scopes (class bodies invisible to
nested functions, the first iterable of a comprehension outside it), the same
"bound earlier in this scope" ordering for plain names, the same dotted-import
lookup. Names bound locally resolve to nothing. `tests/test_module_index.py` checks
the results against LibCST's providers. Unlike LibCST, a `from module import *` of a
module of the project binds the names that module exports, once the program has told
the index what they are (`bind_star_import`; tests/test_star_imports.py).
"""

from __future__ import annotations

import builtins
import dataclasses
from bisect import bisect_left, insort
from collections.abc import Callable, Iterator

import libcst as cst

from autoaccel.analysis.names import canonical

# Fields holding whitespace, brackets and other tokens: nothing a rule looks at.
_TOKEN_FIELDS = frozenset(
    {
        "asynchronous", "colon", "comma", "comment", "default_indent", "default_newline",
        "dot", "empty_lines", "encoding", "equal", "first_colon", "footer",
        "has_trailing_newline", "header", "indent", "lbrace", "lbracket", "leading_lines",
        "lines_after_decorators", "lpar", "newline", "operator", "posonly_ind", "rbrace",
        "rbracket", "relative", "rpar", "second_colon", "semicolon", "star",
        "trailing_whitespace",
    }
)  # fmt: skip
# Where the dataclass field order is not the order of the source text.
_SOURCE_ORDER = {
    cst.FunctionDef: ("decorators", "name", "type_parameters", "params", "returns", "body"),
    cst.ClassDef: ("decorators", "name", "type_parameters", "bases", "keywords", "body"),
    cst.IfExp: ("body", "test", "orelse"),
    cst.Parameters: ("posonly_params", "params", "star_arg", "kwonly_params", "star_kwarg"),
    cst.ExceptHandler: ("type", "name", "body"),
    cst.ExceptStarHandler: ("type", "name", "body"),
    cst.Arg: ("keyword", "value"),
    cst.MatchCase: ("pattern", "guard", "body"),
}
_FIELDS: dict[type, tuple[str, ...]] = {}


def child_fields(kind: type) -> tuple[str, ...]:
    """The fields of a node type that hold child nodes, in source order."""
    found = _FIELDS.get(kind)
    if found is None:
        found = _SOURCE_ORDER.get(kind) or tuple(
            f.name
            for f in dataclasses.fields(kind)
            if f.name not in _TOKEN_FIELDS and not f.name.startswith("whitespace")
        )
        _FIELDS[kind] = found
    return found


# Whether a type is a LibCST node: `isinstance(x, cst.CSTNode)` runs ABCMeta's Python
# code for every non-node value, and this test runs for every field of every node.
_IS_NODE: dict[type, bool] = {}


def _is_node(kind: type) -> bool:
    known = _IS_NODE.get(kind)
    if known is None:
        known = _IS_NODE[kind] = issubclass(kind, cst.CSTNode)
    return known


def children(node: cst.CSTNode) -> list[cst.CSTNode]:
    """The child nodes of `node` (tokens and whitespace left out), in source order.
    (A list, not a generator: the walks call this ~1,000,000 times a conversion.)"""
    found: list[cst.CSTNode] = []
    for name in child_fields(type(node)):
        value = getattr(node, name)
        kind = type(value)
        if kind is tuple or kind is list:
            found.extend(item for item in value if _is_node(type(item)))
        elif _is_node(kind):
            found.append(value)
    return found


def descendants(node: cst.CSTNode) -> Iterator[cst.CSTNode]:
    """`node` and everything below it, parents before children, in source order."""
    stack = [node]
    while stack:
        current = stack.pop()
        yield current
        below = children(current)
        below.reverse()
        stack.extend(below)


def repeats_a_node(module: cst.Module) -> bool:
    """Whether one node object sits at two places of `module` (whitespace aside)."""
    seen: set[cst.CSTNode] = set()
    for node in descendants(module):
        if node in seen:
            return True
        seen.add(node)
    return False


def repeats_a_node_since(module: cst.Module, before: ModuleIndex) -> bool:
    """`repeats_a_node(module)` for a rewrite of the module `before` indexes (which held
    each node once), walking only the nodes the rewrite made: a node of `before` sits
    twice only where made nodes hold it twice, or hold it and one of its ancestors."""
    kept = before.parents
    made: set[cst.CSTNode] = set()
    held: set[cst.CSTNode] = set()  # nodes of `before` that made nodes hold
    stack = [module] if module is not before.module else []
    while stack:
        for child in children(stack.pop()):
            if child in held or child in made:
                return True
            if child in kept:
                held.add(child)
            else:
                made.add(child)
                stack.append(child)
    return any(ancestor in held for node in held for ancestor in before.ancestors(node))


def _binds(statement: cst.Import | cst.ImportFrom, bindings: list, count: int) -> bool:
    """Whether `statement` made one of the first `count` of `bindings`."""
    return any(b is not None and b[2] is statement for b in bindings[:count])


# Nodes whose end LibCST's scope analysis counts as a new binding point (a set of
# exact types: cheaper than `isinstance` with LibCST's ABCs, for every node).
_BINDING_STATEMENTS = frozenset({
    cst.AnnAssign, cst.AsName, cst.Assign, cst.AugAssign, cst.ClassDef, cst.CompFor,
    cst.FunctionDef, cst.Global, cst.Import, cst.ImportFrom, cst.NamedExpr, cst.Nonlocal,
    cst.Parameters, cst.WithItem,
})  # fmt: skip
_DEFINITIONS = (cst.FunctionDef, cst.ClassDef)


class Scope:
    """A module, function, class or comprehension namespace."""

    __slots__ = ("parent", "is_class", "bindings", "redirects", "count", "module")

    def __init__(self, parent: Scope | None, is_class: bool = False) -> None:
        self.parent = parent
        self.is_class = is_class
        self.bindings: dict[str, list[tuple[int, Scope, cst.Import | cst.ImportFrom | None]]] = {}
        self.redirects: dict[str, Scope] = {}  # `global x` / `nonlocal x`
        self.count = 0  # binding statements finished so far
        self.module: Scope = parent.module if parent is not None else self

    def _visible_parent(self, start: Scope | None = None) -> Scope | None:
        parent = start if start is not None else self.parent
        while parent is not None and parent.is_class:
            parent = parent.parent
        return parent

    def owner(self, name: str) -> Scope:
        """The scope a binding of `name` made here lands in."""
        redirect = self.redirects.get(name)
        if redirect is None or redirect is self:
            return self  # `global x` at module level names the module's own `x`
        target = self._visible_parent(redirect)
        return target.owner(name) if target is not None else self

    def bind(self, name: str, statement: cst.Import | cst.ImportFrom | None = None) -> None:
        target = self.owner(name)
        target.bindings.setdefault(name, []).append((target.count, target, statement))

    def contains(self, name: str) -> bool:
        if name in self.redirects and self.redirects[name] is not self:
            return self.redirects[name].contains(name)
        if self.bindings.get(name):
            return True
        parent = self._visible_parent()
        return parent.contains(name) if parent is not None else hasattr(builtins, name)

    def lookup(self, name: str, origin: Scope | None = None) -> list:
        """Every binding `name` may refer to from here (None for a builtin)."""
        origin = origin or self
        if name in self.redirects and self.redirects[name] is not self:
            target = self._visible_parent(self.redirects[name])
            return target.lookup(name, origin) if target is not None else []
        if name in self.bindings:
            return self.bindings[name]
        parent = self._visible_parent()
        if parent is not None:
            return parent.lookup(name, origin)
        return [None] if hasattr(builtins, name) else []


class ModuleIndex:
    """Parents, scopes and qualified names of one module, from a single pass."""

    def __init__(self, module: cst.Module) -> None:
        self.module = module
        self.parents: dict[cst.CSTNode, cst.CSTNode] = {}
        self.scopes: dict[cst.CSTNode, Scope] = {}
        self._accesses: dict[cst.CSTNode, tuple[str, Scope, int]] = {}
        self._accesses_by_name: dict[str, list[tuple[str, Scope, int]]] | None = None
        self._stores: set[cst.CSTNode] = set()
        self._names: dict[cst.CSTNode, frozenset[str]] = {}
        self._import_names: dict[tuple[cst.CSTNode, str], frozenset[str]] = {}
        self._bound_names: dict[tuple[int, int, str], frozenset[str]] = {}
        self._attribute: cst.Attribute | None = None  # outermost attribute being walked
        self._pending: list[tuple[cst.Name, cst.Attribute | None, Scope, int]] = []
        # `from module import *` with the scope and position it binds at; once told what
        # the module exports (`bind_star_import`), the names it binds and what they mean
        self.star_imports: list[tuple[cst.ImportFrom, Scope, int]] = []
        self._star_exports: dict[cst.ImportFrom, dict[str, frozenset[str]]] = {}
        self._visit(module, Scope(None), False)
        for name, attribute, scope, index in self._pending:
            self._record_access(name, attribute, scope, index)
        self._pending = []

    # -- queries -------------------------------------------------------------------
    def parent(self, node: cst.CSTNode) -> cst.CSTNode | None:
        return self.parents.get(node)

    def ancestors(self, node: cst.CSTNode) -> Iterator[cst.CSTNode]:
        parent = self.parents.get(node)
        while parent is not None:
            yield parent
            parent = self.parents.get(parent)

    def scope_of(self, node: cst.CSTNode) -> cst.FunctionDef | cst.Module:
        """The function that holds `node`, or the module."""
        return next(
            (a for a in self.ancestors(node) if isinstance(a, cst.FunctionDef)), self.module
        )

    def qualified_names(self, node: cst.CSTNode) -> frozenset[str]:
        """The canonical names `node` refers to when they come from an import or are
        builtins (`torch.utils.data.DataLoader`, `builtins.print`); empty otherwise."""
        found = self._names.get(node)
        if found is None:
            found = self._names[node] = frozenset(canonical(n) for n in self._resolve(node))
        return found

    def bindings(self, name: str, at: cst.CSTNode) -> list[cst.Import | cst.ImportFrom | None]:
        """What binds `name` in the scope `at` sees it in (LibCST's `scope[name]`): each
        binding's import statement, or None for any other binding (an assignment, a
        `def`, a parameter, a builtin)."""
        scope = self.scopes.get(at)
        if scope is None:
            return []
        return [None if binding is None else binding[2] for binding in scope.lookup(name)]

    def reads(self, statement: cst.Import | cst.ImportFrom, name: str) -> int:
        """How many reads of `name` (or of `name.attribute`) refer to the binding
        `statement` makes (LibCST's `len(assignment.references)`)."""
        if self._accesses_by_name is None:  # grouped once: each query reads its name's only
            self._accesses_by_name = {}
            for access in self._accesses.values():
                self._accesses_by_name.setdefault(access[0].partition(".")[0], []).append(access)
        return sum(
            (accessed == name or accessed.startswith(name + "."))
            and _binds(statement, *self._earlier(scope, accessed, index))
            for accessed, scope, index in self._accesses_by_name.get(name.partition(".")[0], ())
        )

    def is_read(self, statement: cst.Import | cst.ImportFrom, name: str) -> bool:
        """Whether the name `statement` binds as `name` is read anywhere."""
        return self.reads(statement, name) > 0

    def exports(self, name: str) -> dict[str, frozenset[str]]:
        """What `from <this module> import *` binds, this module imported as `name`: the
        names of its `__all__`, or else its top-level names without a leading underscore,
        each with what it refers to (`random` for the module's `import random`,
        `name.read_file` for a function it defines)."""
        scope = self.scopes[self.module]
        public = _declared_all(self.module)
        if public is None:
            public = [n for n in scope.bindings if not n.startswith("_") and "." not in n]
        found: dict[str, frozenset[str]] = {}
        for exported in public:
            bindings = scope.bindings.get(exported, [])
            meant = self._names_of(bindings, len(bindings), exported)
            if not bindings or any(binding[2] is None for binding in bindings):
                meant |= {f"{name}.{exported}"}  # defined here, or a submodule `__all__` names
            found[exported] = meant
        return found

    def unbound(self) -> frozenset[str]:
        """The names read here that nothing binds, not even a builtin, and that a star
        import may bind (no leading underscore): what a star import of a library, whose
        exports are unknown, must have bound."""
        return frozenset(
            name
            for name, scope, _ in self._accesses.values()
            if not name.startswith("_") and not scope.lookup(name)
        )

    def bind_star_import(
        self, statement: cst.ImportFrom, exports: dict[str, frozenset[str]]
    ) -> None:
        """Bind the names `statement`, a `from module import *` of this module, takes from
        the module's `exports` (its `ModuleIndex.exports`), where it runs. A name this
        module binds itself is left to its own binding: a script that imports `torch`, or
        defines `args`, beside a star import means its own."""
        if statement in self._star_exports:
            return
        scope, position = next((s, p) for node, s, p in self.star_imports if node is statement)
        self._star_exports[statement] = exports
        for name in exports:
            bindings = scope.bindings.setdefault(name, [])
            if any(binding[2] not in self._star_exports for binding in bindings):
                continue
            insort(bindings, (position, scope, statement), key=lambda binding: binding[0])
        self._names.clear()  # names read before may mean these now
        self._bound_names.clear()

    def _resolve(self, node: cst.CSTNode) -> frozenset[str]:
        access = self._accesses.get(node)
        if access is not None:
            name, scope, index = access
            return self._names_of(*self._earlier(scope, name, index), name)
        scope = self.scopes.get(node)
        if scope is None or node in self._stores or isinstance(node, _DEFINITIONS):
            return frozenset()  # a name being bound: local, never an import
        full = _full_name(node)
        if full is None:
            return frozenset()
        prefix: str | None = full
        while prefix:
            if scope.contains(prefix):
                bindings = scope.lookup(prefix)
                return self._names_of(bindings, len(bindings), full)
            cut = prefix.rfind(".")
            prefix = prefix[:cut] if cut > 0 else None
        return frozenset()

    @staticmethod
    def _earlier(scope: Scope, name: str, index: int) -> tuple[list, int]:
        """What a plain name read refers to, as `(bindings, count)`: the first `count`
        of `bindings`. Bindings in its own scope count only when made before it
        (LibCST's rule), else the enclosing scopes' ones."""
        found = scope.lookup(name)
        if found and found[0] is not None and found[0][1] is scope:
            # one scope's bindings, in the order they were made
            count = bisect_left(found, index, key=lambda binding: binding[0])
            if count or scope.parent is None:
                return found, count
            found = scope.parent.lookup(name, scope)
        return found, len(found)

    def _names_of(self, bindings: list, count: int, full: str) -> frozenset[str]:
        """What `full` names through the first `count` of `bindings`: a builtin, or what
        the imports among them bind. Kept per import and per binding list: a script that
        imports `torch` in every function, or a file of many scripts joined together,
        asks the same imports about the same name many times."""
        if not bindings or bindings[0] is None:
            return frozenset({f"builtins.{full.split('.')[0]}"} if bindings else ())
        key = (id(bindings), count, full)  # the lists live in the scopes, as long as this index
        found = self._bound_names.get(key)
        if found is None:
            names: set[str] = set()
            for binding in bindings[:count]:
                if binding[2] is not None:
                    names |= self._import_names_of(binding[2], full)
            found = self._bound_names[key] = frozenset(names)
        return found

    def _import_names_of(self, statement: cst.Import | cst.ImportFrom, full: str) -> frozenset[str]:
        key = (statement, full)
        names = self._import_names.get(key)
        if names is None:
            star = self._star_exports.get(statement)  # type: ignore[arg-type]
            if star is not None:
                root, dot, rest = full.partition(".")
                names = frozenset(f"{meant}{dot}{rest}" for meant in star.get(root, ()))
            else:
                names = frozenset(_imported_names(statement, full))
            self._import_names[key] = names
        return names

    # -- the pass ------------------------------------------------------------------
    def _visit(self, node: cst.CSTNode, scope: Scope, store: bool) -> None:
        self.scopes[node] = scope
        special = self._SPECIAL.get(type(node))
        if special is not None:
            special(self, node, scope, store)
        else:
            store = store and isinstance(
                node, (cst.Tuple, cst.List, cst.StarredElement, cst.Element)
            )
            for child in children(node):
                self.parents[child] = node
                self._visit(child, scope, store)
        if type(node) in _BINDING_STATEMENTS:
            scope.count += 1

    def _child(
        self, parent: cst.CSTNode, child: cst.CSTNode | None, scope: Scope, store: bool = False
    ) -> None:
        if child is not None:
            self.parents[child] = parent
            self._visit(child, scope, store)

    def _children(self, parent: cst.CSTNode, nodes, scope: Scope, store: bool = False) -> None:
        for child in nodes:
            self._child(parent, child, scope, store)

    def _link(self, parent: cst.CSTNode) -> None:
        """Record parents below `parent` without scopes (names there mean nothing)."""
        for child in children(parent):
            self.parents[child] = parent
            self._link(child)

    def _name(self, node: cst.Name, scope: Scope, store: bool) -> None:
        if store:
            self._stores.add(node)
            scope.bind(node.value)
        else:
            self._pending.append((node, self._attribute, scope, scope.count))

    def _record_access(
        self, node: cst.Name, attribute: cst.Attribute | None, scope: Scope, index: int
    ) -> None:
        name: str = node.value
        target: cst.CSTNode = node
        if attribute is not None:
            for dotted, part in _dotted_names(attribute):
                if scope.contains(dotted):
                    name, target = dotted, part
                    break
        self._accesses[target] = (name, scope, index)

    def _attribute_node(self, node: cst.Attribute, scope: Scope, store: bool) -> None:
        outermost = self._attribute is None
        if outermost:
            self._attribute = node
        self._child(node, node.value, scope)
        self.parents[node.attr] = node
        if outermost:
            self._attribute = None

    def _call(self, node: cst.Call, scope: Scope, store: bool) -> None:
        outer, self._attribute = self._attribute, None
        self._child(node, node.func, scope)
        self._children(node, node.args, scope)
        self._attribute = outer

    def _arg(self, node: cst.Arg, scope: Scope, store: bool) -> None:
        if node.keyword is not None:
            self.parents[node.keyword] = node
        self._child(node, node.value, scope)

    def _subscript(self, node: cst.Subscript, scope: Scope, store: bool) -> None:
        self._child(node, node.value, scope)
        self._children(node, node.slice, scope)

    def _assign(self, node: cst.Assign, scope: Scope, store: bool) -> None:
        for target in node.targets:
            self.parents[target] = node
            self.scopes[target] = scope
            self._child(target, target.target, scope, True)
        self._child(node, node.value, scope)

    def _target_then_value(self, node, scope: Scope, store: bool) -> None:
        # AnnAssign, AugAssign, NamedExpr
        self._child(node, node.target, scope, True)
        for name in ("annotation", "value"):
            self._child(node, getattr(node, name, None), scope)

    def _as_name(self, node: cst.AsName, scope: Scope, store: bool) -> None:
        self._child(node, node.name, scope, True)

    def _for(self, node: cst.For, scope: Scope, store: bool) -> None:
        self._child(node, node.target, scope, True)
        scope.count += 1
        self._children(node, (node.iter, node.body, node.orelse), scope)

    def _import(self, node: cst.Import | cst.ImportFrom, scope: Scope, store: bool) -> None:
        self._link(node)
        if isinstance(node.names, cst.ImportStar):
            self.star_imports.append((node, scope, scope.count))  # type: ignore[arg-type]
            return
        for alias in node.names:
            self.scopes[alias] = scope
            bound = alias.asname.name if alias.asname is not None else alias.name
            for dotted, _ in _dotted_names(bound):  # type: ignore[arg-type]
                scope.bind(dotted, node)

    def _declaration(self, node: cst.Global | cst.Nonlocal, scope: Scope, store: bool) -> None:
        self._link(node)
        for item in node.names:
            name = item.name.value
            scope.redirects[name] = scope.module if isinstance(node, cst.Global) else scope.parent  # type: ignore[assignment]

    def _definition_name(
        self, node: cst.FunctionDef | cst.ClassDef | cst.Param, scope: Scope
    ) -> None:
        """The name a `def`, `class` or parameter binds in `scope`."""
        scope.bind(node.name.value)
        self.parents[node.name] = node
        self.scopes[node.name] = scope

    def _function(self, node: cst.FunctionDef, scope: Scope, store: bool) -> None:
        self._definition_name(node, scope)
        inner = Scope(scope)
        self._child(node, node.params, inner)
        self._child(node, node.body, inner)
        self._children(node, node.decorators, scope)
        self._child(node, node.returns, scope)

    def _lambda(self, node: cst.Lambda, scope: Scope, store: bool) -> None:
        inner = Scope(scope)
        self._child(node, node.params, inner)
        self._child(node, node.body, inner)

    def _param(self, node: cst.Param, scope: Scope, store: bool) -> None:
        self._definition_name(node, scope)
        outer = scope.parent if scope.parent is not None else scope
        self._child(node, node.default, outer)
        self._child(node, node.annotation, outer)

    def _class(self, node: cst.ClassDef, scope: Scope, store: bool) -> None:
        self._definition_name(node, scope)
        self._children(node, node.decorators, scope)
        self._children(node, node.bases, scope)
        self._children(node, node.keywords, scope)
        inner = Scope(scope, is_class=True)
        self.parents[node.body] = node
        self.scopes[node.body] = inner
        for statement in node.body.body:  # type: ignore[union-attr]
            self._child(node.body, statement, inner)

    def _comprehension(self, node, scope: Scope, store: bool) -> None:
        first: cst.CompFor = node.for_in
        self.parents[first] = node
        self.scopes[first] = scope
        self._child(first, first.iter, scope)
        inner = Scope(scope)
        self._child(first, first.target, inner, True)
        inner.count += 1
        self._children(first, first.ifs, inner)
        self._child(first, first.inner_for_in, inner)
        if isinstance(node, cst.DictComp):
            self._children(node, (node.key, node.value), inner)
        else:
            self._child(node, node.elt, inner)

    def _comp_for(self, node: cst.CompFor, scope: Scope, store: bool) -> None:
        # A nested `for` of a comprehension: everything is inside its scope.
        self._child(node, node.target, scope, True)
        self._child(node, node.iter, scope)
        self._children(node, node.ifs, scope)
        self._child(node, node.inner_for_in, scope)

    def _name_node(self, node: cst.Name, scope: Scope, store: bool) -> None:
        self._name(node, scope, store)

    _SPECIAL: dict[type, Callable] = {
        cst.Name: _name_node,
        cst.Attribute: _attribute_node,
        cst.Call: _call,
        cst.Arg: _arg,
        cst.Subscript: _subscript,
        cst.Assign: _assign,
        cst.AnnAssign: _target_then_value,
        cst.AugAssign: _target_then_value,
        cst.NamedExpr: _target_then_value,
        cst.AsName: _as_name,
        cst.For: _for,
        cst.Import: _import,
        cst.ImportFrom: _import,
        cst.Global: _declaration,
        cst.Nonlocal: _declaration,
        cst.FunctionDef: _function,
        cst.Lambda: _lambda,
        cst.Param: _param,
        cst.ClassDef: _class,
        cst.ListComp: _comprehension,
        cst.SetComp: _comprehension,
        cst.DictComp: _comprehension,
        cst.GeneratorExp: _comprehension,
        cst.CompFor: _comp_for,
    }


def _full_name(node: cst.CSTNode) -> str | None:
    """LibCST's `get_full_name_for_node` (an attribute of an unnamed value is `None.x`)."""
    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute):
        return f"{_full_name(node.value)}.{node.attr.value}"
    if isinstance(node, (cst.Call,)):
        return _full_name(node.func)
    if isinstance(node, cst.Subscript):
        return _full_name(node.value)
    if isinstance(node, (cst.FunctionDef, cst.ClassDef)):
        return _full_name(node.name)
    if isinstance(node, cst.Decorator):
        return _full_name(node.decorator)
    return None


def _declared_all(module: cst.Module) -> list[str] | None:
    """The names of a top-level `__all__ = [...]` (or a tuple) of string literals."""
    declared = None
    for statement in module.body:
        for small in statement.body if isinstance(statement, cst.SimpleStatementLine) else ():
            if (
                isinstance(small, cst.Assign)
                and any(
                    isinstance(t.target, cst.Name) and t.target.value == "__all__"
                    for t in small.targets
                )
                and isinstance(small.value, (cst.List, cst.Tuple))
            ):
                declared = [
                    e.value.evaluated_value for e in small.value.elements
                    if isinstance(e.value, cst.SimpleString) and isinstance(e.value.evaluated_value, str)
                ]  # fmt: skip
    return declared


def _dotted_names(node: cst.BaseExpression) -> Iterator[tuple[str, cst.CSTNode]]:
    """`a.b.c` -> ("a.b.c", node), ("a.b", ...), ("a", Name): longest first."""
    if isinstance(node, cst.Name):
        yield node.value, node
        return
    if not isinstance(node, cst.Attribute):
        return
    value = node.value
    if isinstance(value, cst.Call):
        if isinstance(value.func, (cst.Attribute, cst.Name)):
            yield from _dotted_names(value.func)
        return
    if isinstance(value, (cst.Attribute, cst.Name)):
        inner = list(_dotted_names(value))
        if inner:
            yield f"{inner[0][0]}.{node.attr.value}", node
            yield from inner


def from_module(statement: cst.ImportFrom) -> str:
    """The module a `from ... import` imports from, as spelled (`..data` for a relative one)."""
    module = (_full_name(statement.module) or "") if statement.module is not None else ""
    return "." * len(statement.relative) + module


def _imported_names(statement: cst.Import | cst.ImportFrom, full: str) -> set[str]:
    """What `full` (a dotted name starting with a name the import binds) refers to."""
    module = from_module(statement) if isinstance(statement, cst.ImportFrom) else ""
    found: set[str] = set()
    for alias in statement.names:  # type: ignore[union-attr]
        real = _full_name(alias.name)
        if not real:
            continue
        parts = real.split(".")
        for size in range(len(parts), 0, -1):
            real_name = ".".join(parts[:size])
            as_name = real_name
            if module.endswith("."):
                real_name = f"{module}{real_name}"
            elif module:
                real_name = f"{module}.{real_name}"
            if alias.asname is not None and isinstance(alias.asname.name, cst.Name):
                as_name = alias.asname.name.value
            if full.startswith(as_name):
                rest = full.split(as_name, 1)[1]
                if rest and not rest.startswith("."):
                    continue
                rest = rest.lstrip(".")
                found.add(f"{real_name}.{rest}" if rest else real_name)
                break
    return found


_METHODS: dict[type, tuple[tuple[str, str], ...]] = {}


def _handler_names(kind: type) -> tuple[tuple[str, str], ...]:
    """("visit" | "leave", node type name) of a visitor class's methods. LibCST's own
    visitor bases are skipped: their hundreds of methods do nothing."""
    found = _METHODS.get(kind)
    if found is None:
        names = {
            name
            for cls in kind.__mro__
            if not cls.__module__.startswith("libcst")
            for name in vars(cls)
        }
        found = _METHODS[kind] = tuple(
            (prefix, name[len(prefix) + 1 :])
            for name in sorted(names)
            for prefix in ("visit", "leave")
            if name.startswith(prefix + "_")
            and "_" not in name[len(prefix) + 1 :]
            and isinstance(getattr(cst, name[len(prefix) + 1 :], None), type)
        )
    return found


def run_visitors(module: cst.Module, visitors: list) -> None:
    """Call the `visit_<Node>(node)` / `leave_<Node>(node)` methods of `visitors`
    for every node of `module`, in one walk in source order (LibCST's batched
    visiting, without rebuilding nodes on the way)."""
    visits: dict[type, list[Callable]] = {}
    leaves: dict[type, list[Callable]] = {}
    for visitor in visitors:
        for prefix, name in _handler_names(type(visitor)):
            table = visits if prefix == "visit" else leaves
            table.setdefault(getattr(cst, name), []).append(getattr(visitor, f"{prefix}_{name}"))

    def walk(node: cst.CSTNode) -> None:
        kind = type(node)
        for handler in visits.get(kind, ()):
            handler(node)
        for child in children(node):
            walk(child)
        for handler in leaves.get(kind, ()):
            handler(node)

    walk(module)
