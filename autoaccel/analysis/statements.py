"""The statements of a module, without visiting its expressions: the blocks of compound
statements and of their clauses, in source order."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import libcst as cst

# The nodes a statement can sit in: a block, a compound statement, or a clause of one.
HOLDS_STATEMENTS = (
    cst.Module,
    cst.BaseCompoundStatement,
    cst.BaseSuite,
    cst.Else,
    cst.ExceptHandler,
    cst.ExceptStarHandler,
    cst.Finally,
    cst.MatchCase,
)


Statement = cst.BaseStatement | cst.SimpleStatementSuite | cst.IndentedBlock


def statements(body: Sequence[cst.BaseStatement]) -> Iterator[Statement]:
    """The statements of `body` and the statements in them, in source order (a one-line
    suite stands for its small statements; an empty block, which a rewrite may leave, for
    the `pass` LibCST writes for it)."""
    for statement in body:
        yield statement
        if isinstance(statement, cst.BaseCompoundStatement):
            yield from _blocks(statement)


_BLOCKS = ("body", "cases", "handlers", "orelse", "finalbody")  # in source order


def _blocks(node: cst.CSTNode) -> Iterator[Statement]:
    """The statements in the blocks of a compound statement or of a clause of one."""
    for name in _BLOCKS:
        value = getattr(node, name, None)
        for part in value if isinstance(value, Sequence) else (value,):
            if isinstance(part, cst.SimpleStatementSuite):
                yield part
            elif isinstance(part, cst.IndentedBlock):
                yield from statements(part.body) if part.body else (part,)
            elif isinstance(part, cst.If):  # an `elif`
                yield part
                yield from _blocks(part)
            elif part is not None:  # else, except, finally, case
                yield from _blocks(part)
