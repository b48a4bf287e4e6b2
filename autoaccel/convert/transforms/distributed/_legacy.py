"""What the migrations of a legacy distributed library to torchrun DDP share.

A migration plans its edits over the whole module first: expressions it replaces,
statements it removes, and the nodes whose library names it thereby handles. Any name of
the library left outside them is listed with its line and the migration changes nothing
(fail closed: the conversion then refuses, as for any `wrong` skip).
"""

from __future__ import annotations

from collections.abc import Sequence

import libcst as cst

from autoaccel.analysis.shapes import find
from autoaccel.cst_edit import code_of


def is_call_statement(statement: cst.CSTNode, call: cst.Call) -> bool:
    """Whether `statement` is the call `call` alone (`hvd.init()`)."""
    return (
        isinstance(statement, cst.SimpleStatementLine)
        and len(statement.body) == 1
        and isinstance(statement.body[0], cst.Expr)
        and statement.body[0].value is call
    )


def keyword_args(call: cst.Call) -> dict[str, cst.BaseExpression]:
    """The keyword arguments of `call` by name."""
    return {a.keyword.value: a.value for a in call.args if a.keyword is not None}


class LegacyMigration:
    """A mixin for a `DistributedStep` that migrates the library under the module
    `root` (named `library` in messages)."""

    library: str
    root: str
    label: str  # what the logged changes are about: "Horovod"
    # The top-level package: its import lines (`import apex`) go too once no name of it
    # is left; default `root`.
    package: str = ""
    # Why a use that is left is refused.
    left_over = "no torchrun rewrite for this use of {library}; migrate it by hand"

    def start_migration(self) -> None:
        self.expressions: dict[cst.CSTNode, cst.BaseExpression] = {}
        self.handled: set[cst.CSTNode] = set()  # subtrees whose library names are migrated
        self.problems: list[tuple[cst.CSTNode, str]] = []
        self.notes: list[tuple[cst.CSTNode, str]] = []  # changes, logged once all is migrated

    def handled_inside(self, node: cst.CSTNode) -> bool:
        """Whether `node` lies in a subtree the migration rewrites or removes."""
        return node in self.handled or any(a in self.handled for a in self.ancestors(node))  # type: ignore[attr-defined]

    def consume(self, node: cst.CSTNode | None) -> None:
        """Count the library names in `node` as migrated (an argument the rewrite uses up)."""
        if node is not None:
            self.handled.add(node)

    def replace_expression(self, node: cst.CSTNode, code: str, *handled: cst.CSTNode) -> None:
        """Put the expression `code` in place of `node`."""
        if not code:
            self.unsupported(node, "this form")
            return
        self.expressions[node] = cst.parse_expression(code)
        self.consume(node)
        self.notes.append((node, f"`{code_of(node)}` -> `{code}`"))

    def drop(self, call: cst.Call, note: str) -> None:
        """Remove the statement that is the call `call` alone."""
        statement = self.statement_of(call)  # type: ignore[attr-defined]
        if not is_call_statement(statement, call):
            self.unsupported(call, "this call inside a larger statement")
            return
        self.remove_statement(statement)
        self.notes.append((call, note))

    def remove_statement(self, statement: cst.BaseStatement) -> None:
        """Remove `statement`; an `if` without `else` left empty goes too (its test
        only asks, `if args.distributed:`), any other block left empty keeps a `pass`."""
        self.consume(statement)
        self.replace[statement] = []  # type: ignore[attr-defined]
        block = self.parent(statement)  # type: ignore[attr-defined]
        if isinstance(block, cst.Module) or block is None:
            return
        if any(self.replace.get(s) != [] for s in block.body):  # type: ignore[attr-defined]
            return
        owner = self.parent(block)  # type: ignore[attr-defined]
        if isinstance(owner, cst.If) and owner.orelse is None:
            self.remove_statement(owner)
        else:
            self.replace[statement] = [cst.SimpleStatementLine([cst.Pass()])]  # type: ignore[attr-defined]

    def unsupported(self, node: cst.CSTNode, what: str) -> None:
        """Report `node` (once: its names are not listed again)."""
        self.problems.append((node, what))
        self.consume(node)

    def finish_migration(self, module: cst.Module) -> bool:
        """Whether every name of the library is migrated: then its imports go and the
        changes are logged. Otherwise each use left is reported and nothing changes."""
        package = self.package or self.root
        imports = [s for s in module.body if self._imports_only(s, self.root)]
        for reference in self._references(module, imports, self.root):
            self.unsupported(reference, f"`{code_of(reference)}`")
        wider = [s for s in module.body if s not in imports and self._imports_only(s, package)]
        if wider and not self._references(module, imports + wider, package):
            imports += wider
        if self.problems:
            for node, what in self.problems:
                self.skipped(  # type: ignore[attr-defined]
                    self.library,
                    f"{what}: {self.left_over.format(library=self.library)}",
                    node,
                    wrong=True,
                )
            self.expressions, self.replace, self.imports = {}, {}, []  # type: ignore[attr-defined]
            return False
        for statement in imports:
            self.remove_statement(statement)
        for node, note in self.notes:
            self.changed(node, f"{self.label}: {note}")  # type: ignore[attr-defined]
        return True

    def _in_library(self, node: cst.CSTNode, root: str = "") -> bool:
        return any(_under(n, root or self.root) for n in self.qualified_names(node))  # type: ignore[attr-defined]

    @staticmethod
    def _imports_only(statement: cst.CSTNode, root: str) -> bool:
        """`import horovod.torch as hvd`, `from apex.parallel import ...`: a line that
        imports from `root` only."""
        if not isinstance(statement, cst.SimpleStatementLine) or len(statement.body) != 1:
            return False
        small = statement.body[0]
        if isinstance(small, cst.ImportFrom) and small.module is not None and not small.relative:
            return _under(code_of(small.module), root)
        return isinstance(small, cst.Import) and all(
            _under(code_of(a.name), root) for a in small.names
        )

    def _references(
        self, module: cst.Module, imports: list[cst.CSTNode], root: str
    ) -> list[cst.CSTNode]:
        """The names under `root` used outside the migrated subtrees and the `imports`,
        each as its whole attribute chain (`hvd.Compression.fp16`)."""
        found: list[cst.CSTNode] = []
        for name in find(module, cst.Name):
            chain: cst.CSTNode = name
            parent = self.parent(chain)  # type: ignore[attr-defined]
            while isinstance(parent, cst.Attribute) and parent.value is chain:
                chain, parent = parent, self.parent(parent)  # type: ignore[attr-defined]
            if not self._in_library(chain, root) or self.handled_inside(chain):
                continue
            if any(a in imports for a in self.ancestors(chain)):  # type: ignore[attr-defined]
                continue
            found.append(chain)
        return found

    def rebuild(self, originals: list, updated: list) -> list:
        """The blank lines above a removed statement stay, above the next one kept (the
        line between import sections, between paragraphs); its comments go with it."""
        updated = list(updated)
        replace = self.replace  # type: ignore[attr-defined]
        kept = [i for i, s in enumerate(originals) if replace.get(s) != []]
        for index, original in enumerate(originals):
            lines = original.leading_lines
            if replace.get(original) != [] or not lines or any(line.comment for line in lines):
                continue
            following = next((i for i in kept if i > index), None)
            if following is None:
                continue
            target = originals[following]
            if target in replace:
                first, *rest = replace[target]
                replace[target] = [_with_blank_lines(first, lines), *rest]
            elif len(updated) == len(originals):
                updated[following] = _with_blank_lines(updated[following], lines)
        return super().rebuild(originals, updated)  # type: ignore[misc]

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        return self.expressions.get(original_node, updated_node)

    def leave_Attribute(
        self, original_node: cst.Attribute, updated_node: cst.Attribute
    ) -> cst.BaseExpression:
        return self.expressions.get(original_node, updated_node)


def _under(name: str, root: str) -> bool:
    return name == root or name.startswith(root + ".")


def _with_blank_lines(
    statement: cst.BaseStatement, lines: Sequence[cst.EmptyLine]
) -> cst.BaseStatement:
    """`statement` with the blank `lines` above it, unless it has a blank line already."""
    if any(line.comment is None for line in statement.leading_lines):
        return statement
    return statement.with_changes(leading_lines=[*lines, *statement.leading_lines])
