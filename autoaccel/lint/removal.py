"""A fix that deletes the statement of a call (`torch.cuda.empty_cache()`,
`torch.cuda.synchronize()`): what is left must still parse, and the comments written
above it stay."""

from __future__ import annotations

import libcst as cst

from autoaccel.lint.rule import LintRule, Replacement


def call_statement_removal(rule: LintRule, call: cst.Call) -> dict[cst.CSTNode, Replacement]:
    """Edits deleting the statement that is `call`; empty when it is not a statement of its own."""
    expr = rule.parent(call)
    line = rule.parent(expr) if isinstance(expr, cst.Expr) else None
    if not isinstance(line, (cst.SimpleStatementLine, cst.SimpleStatementSuite)):
        return {}
    others = [small for small in line.body if small is not expr]
    if others:
        # `step(x); torch.cuda.empty_cache()`: drop it from the line.
        others[-1] = others[-1].with_changes(semicolon=cst.MaybeSentinel.DEFAULT)
        return {line: line.with_changes(body=others)}
    block = rule.parent(line)
    if isinstance(line, cst.SimpleStatementSuite) or (
        isinstance(block, cst.IndentedBlock) and len(block.body) == 1
    ):
        # The block's only statement: a block cannot be empty.
        return {expr: cst.Expr(cst.Name("pass"))}
    if isinstance(block, cst.IndentedBlock) and any(empty.comment for empty in line.leading_lines):
        # Keep comments written above the call: they move to the next statement (or stay
        # at the end of the block).
        body = list(block.body)
        index = body.index(line)
        del body[index]
        if index < len(body):
            following = body[index]
            body[index] = following.with_changes(
                leading_lines=[*line.leading_lines, *following.leading_lines]
            )
            return {block: block.with_changes(body=body)}
        footer = [*line.leading_lines, *block.footer]
        return {block: block.with_changes(body=body, footer=footer)}
    return {line: cst.RemoveFromParent()}
