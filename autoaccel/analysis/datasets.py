"""What a Dataset's samples cost to load: read from memory, or computed per sample.

(Plain `isinstance` checks: the analysis runs on every linted file, and
`libcst.matchers` costs a third of a second to import.)
"""

from __future__ import annotations

import libcst as cst

from autoaccel.analysis.index import ModuleIndex
from autoaccel.analysis.shapes import tuple_items

# Conversions of one element that cost no more than the indexing itself.
_SCALAR_CASTS = frozenset({"builtins.int", "builtins.float", "builtins.bool"})


def indexes_only(getitem: cst.FunctionDef, names: ModuleIndex) -> bool:
    """Whether `__getitem__` only indexes attributes of the instance with its index:
    `return self.x[i], int(self.y[i])`. Such a sample is a view of data already in
    memory; nothing is read, decoded or augmented per sample."""
    params = getitem.params.params
    if len(params) != 2 or not isinstance(getitem.body, cst.IndentedBlock):
        return False
    statements = [s for s in getitem.body.body if not _is_docstring(s)]
    if len(statements) != 1 or not isinstance(statements[0], cst.SimpleStatementLine):
        return False
    returned = statements[0].body[0]
    if not isinstance(returned, cst.Return) or returned.value is None:
        return False
    value = returned.value
    parts = tuple_items(value)
    index = params[1].name.value
    return bool(parts) and all(_indexed_attribute(part, index, names) for part in parts)


def _indexed_attribute(node: cst.BaseExpression, index: str, names: ModuleIndex) -> bool:
    """`self.x[index]`, or a scalar cast of it (`int(self.y[index])`)."""
    if (
        isinstance(node, cst.Call)
        and len(node.args) == 1
        and node.args[0].keyword is None
        and not node.args[0].star
        and names.qualified_names(node.func) & _SCALAR_CASTS
    ):
        node = node.args[0].value
    if not isinstance(node, cst.Subscript) or len(node.slice) != 1:
        return False
    owner, element = node.value, node.slice[0].slice
    return (
        isinstance(owner, cst.Attribute)
        and isinstance(owner.value, cst.Name)
        and owner.value.value == "self"
        and isinstance(element, cst.Index)
        and isinstance(element.value, cst.Name)
        and element.value.value == index
    )


def _is_docstring(statement: cst.BaseStatement) -> bool:
    return (
        isinstance(statement, cst.SimpleStatementLine)
        and isinstance(statement.body[0], cst.Expr)
        and isinstance(statement.body[0].value, cst.SimpleString)
    )
