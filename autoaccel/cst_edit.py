"""Small, layout-preserving edits shared by rule fixes and convert transforms.

Inserted code follows black's style; everything around it keeps its bytes.
"""

from __future__ import annotations

import itertools
import sys

import libcst as cst


def set_keyword(call: cst.Call, name: str, value: str | cst.BaseExpression) -> cst.Call:
    """`call` with keyword `name` set to `value`: replaced in place when present,
    appended otherwise, following the call's own layout (one argument per line or not,
    trailing comma or not)."""
    expression = cst.parse_expression(value) if isinstance(value, str) else value
    args = list(call.args)
    for index, arg in enumerate(args):
        if arg.keyword is not None and arg.keyword.value == name:
            args[index] = arg.with_changes(value=expression)
            return call.with_changes(args=args)
    new_arg = cst.Arg(
        value=expression,
        keyword=cst.Name(name),
        equal=cst.AssignEqual(
            whitespace_before=cst.SimpleWhitespace(""),
            whitespace_after=cst.SimpleWhitespace(""),
        ),
    )
    if not args:
        return call.with_changes(args=[new_arg])
    last = args[-1]
    if isinstance(call.whitespace_before_args, cst.ParenthesizedWhitespace):
        # One argument per line: the new one gets a line of its own.
        separator = cst.Comma(whitespace_after=call.whitespace_before_args)
    else:
        separator = cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
    args[-1] = last.with_changes(comma=separator, whitespace_after_arg=cst.SimpleWhitespace(""))
    args.append(
        new_arg.with_changes(comma=last.comma, whitespace_after_arg=last.whitespace_after_arg)
    )
    return call.with_changes(args=args)


def remove_keyword(call: cst.Call, name: str) -> cst.Call:
    """`call` without keyword `name` (no-op when absent), keeping the call's layout."""
    args = list(call.args)
    index = next(
        (i for i, a in enumerate(args) if a.keyword is not None and a.keyword.value == name),
        None,
    )
    if index is None:
        return call
    removed = args.pop(index)
    if index == len(args) and args:
        args[-1] = args[-1].with_changes(
            comma=removed.comma, whitespace_after_arg=removed.whitespace_after_arg
        )
    return call.with_changes(args=args)


def keyword_value(call: cst.Call, name: str) -> cst.BaseExpression | None:
    """The expression passed as keyword `name`, if written in the call itself."""
    for arg in call.args:
        if arg.keyword is not None and arg.keyword.value == name:
            return arg.value
    return None


def code_of(node: cst.CSTNode) -> str:
    """Source text of a node, as it would be printed inside a module."""
    return cst.Module(body=[]).code_for_node(node)


def first_line_of(node: cst.CSTNode) -> str:
    """The first line of a node's code, without the comments and blank lines above it: a
    loop quoted in a message by its header (`for _ in range(n):`)."""
    if hasattr(node, "leading_lines"):
        node = node.with_changes(leading_lines=())
    return code_of(node).strip().splitlines()[0]


def bound_name(alias: cst.ImportAlias) -> str:
    """The name an import binds: `x` of `... import a as x`, else `a` (or `a.b`)."""
    if alias.asname is not None and isinstance(alias.asname.name, cst.Name):
        return alias.asname.name.value
    return code_of(alias.name)


def has_import(module: cst.Module, name: str) -> bool:
    """Whether the module imports `name` at top level: `import os`, or a submodule
    (`import os.path` binds `os` too)."""
    for statement in module.body:
        if not isinstance(statement, cst.SimpleStatementLine):
            continue
        for small in statement.body:
            if isinstance(small, cst.Import) and any(
                alias.asname is None and f"{code_of(alias.name)}.".startswith(f"{name}.")
                for alias in small.names
            ):
                return True
    return False


def add_imports(module: cst.Module, names: tuple[str, ...]) -> cst.Module:
    """`module` with `import NAME` added for every name it does not import yet (see
    `add_import` for where each goes)."""
    for name in dict.fromkeys(names):
        if not has_import(module, name):
            module = add_import(module, f"import {name}")
    return module


def add_import(
    module: cst.Module, statement: str, needed_by: cst.BaseStatement | None = None
) -> cst.Module:
    """`module` with the import line `statement` (`import os`, `import a.b as c`,
    `from a import b as c`) unless that exact line is there (above `needed_by`, the
    first statement of the module's body that uses it, when given: a line further down
    binds the name too late). A standard-library line joins the leading standard-library
    imports, a torch line the torch imports, each in isort's order (`import x` before
    `from x import y`, then by module); any other goes after the leading imports. Only
    the line taking over the top of a section moves the comments and blank lines above
    it."""
    new = cst.parse_statement(statement + "\n")
    body = list(module.body)
    above = itertools.takewhile(lambda s: s is not needed_by, body)
    if any(s.with_changes(leading_lines=[]).deep_equals(new) for s in above):
        return module
    start, end = leading_import_block(module)
    keys = {i: _import_key(body[i]) for i in range(start, end)}  # of the leading imports
    while start < end and keys[start][0] == "__future__":
        start += 1  # they must stay first
    section, key = _import_key(new)
    same = [i for i in range(start, end) if keys[i][0] == section]
    if same:
        position = next((i for i in same if keys[i][1] > key), same[-1] + 1)
    else:
        position = start if section == "stdlib" else end
    if same and position == same[0] or not same and position < end:
        # first of its section: it takes over the blank lines and comments above
        new = new.with_changes(leading_lines=body[position].leading_lines)
        separator = [cst.EmptyLine()] if not same else []
        body[position] = body[position].with_changes(leading_lines=separator)
    previous = keys.get(position - 1)  # the import line above, if any
    if not same and not new.leading_lines and previous and previous[0] in ("stdlib", "__future__"):
        new = new.with_changes(leading_lines=[cst.EmptyLine()])  # a section of its own
    body.insert(position, new)
    return module.with_changes(body=body)


def _import_key(statement: cst.BaseStatement) -> tuple[str | None, tuple[int, str]]:
    """(section, order in the section) of an import line: sections `__future__`,
    `stdlib`, `torch` or None; `import x` sorts before `from x import y`, then by module."""
    small = statement.body[0]  # type: ignore[attr-defined]
    if isinstance(small, cst.Import):
        kind, module = 0, small.names[0].name
    elif isinstance(small, cst.ImportFrom) and small.module is not None and not small.relative:
        kind, module = 1, small.module
    else:
        return None, (0, "")
    dotted = code_of(module)
    top = dotted.split(".")[0]
    if top in ("torch", "__future__"):
        return top, (kind, dotted)
    return "stdlib" if top in sys.stdlib_module_names else None, (kind, dotted)


def leading_import_block(module: cst.Module) -> tuple[int, int]:
    """`(start, end)` indices in `module.body` of the imports at the top (after a
    docstring and module dunders such as `__author__ = ...`, PEP 8's place for them);
    `start == end` when there are none."""
    body = module.body
    start = 1 if body and is_docstring(body[0]) else 0
    while start < len(body) and _is_dunder_assignment(body[start]):
        start += 1
    end = start
    while end < len(body) and _is_import(body[end]):
        end += 1
    return start, end


def _is_dunder_assignment(statement: cst.BaseStatement) -> bool:
    """`__author__ = "..."`, `__all__ = [...]`: one assignment of a dunder name."""
    if not isinstance(statement, cst.SimpleStatementLine) or len(statement.body) != 1:
        return False
    assign = statement.body[0]
    if not isinstance(assign, cst.Assign) or len(assign.targets) != 1:
        return False
    target = assign.targets[0].target
    return (
        isinstance(target, cst.Name)
        and len(target.value) > 4
        and (target.value.startswith("__") and target.value.endswith("__"))
    )


def _is_import(statement: cst.BaseStatement) -> bool:
    return isinstance(statement, cst.SimpleStatementLine) and all(
        isinstance(small, (cst.Import, cst.ImportFrom)) for small in statement.body
    )


def is_docstring(statement: cst.BaseStatement) -> bool:
    """A statement made of one string: a docstring when it comes first in its block."""
    return (
        isinstance(statement, cst.SimpleStatementLine)
        and len(statement.body) == 1
        and isinstance(statement.body[0], cst.Expr)
        and isinstance(statement.body[0].value, (cst.SimpleString, cst.ConcatenatedString))
    )


# Expressions that bind tighter than any operator: they can stand anywhere.
_ATOMS = (
    cst.Name, cst.Attribute, cst.Call, cst.Subscript, cst.BaseNumber, cst.BaseString,
    cst.List, cst.Tuple, cst.Dict, cst.Set, cst.ListComp, cst.SetComp, cst.DictComp,
    cst.GeneratorExp,
)  # fmt: skip
# Places where any expression can stand without parentheses.
_OPEN_CONTEXTS = (
    cst.Arg, cst.Assign, cst.AnnAssign, cst.AugAssign, cst.Return, cst.Element,
    cst.Expr, cst.DictElement,
)  # fmt: skip


def _breaks_line_outside_brackets(node: cst.BaseExpression) -> bool:
    """Whether the expression needs enclosing brackets because it spans lines."""
    if node.lpar:
        return False
    if isinstance(node, cst.Call):
        return _breaks_line_outside_brackets(node.func) or "\n" in code_of(
            node.whitespace_after_func
        )
    if isinstance(node, cst.Subscript):
        return _breaks_line_outside_brackets(node.value) or "\n" in code_of(
            node.whitespace_after_value
        )
    if isinstance(node, cst.Attribute):
        return _breaks_line_outside_brackets(node.value) or "\n" in code_of(node.dot)
    if isinstance(node, (cst.List, cst.Tuple, cst.Dict, cst.Set, cst.ListComp, cst.SetComp,
                         cst.DictComp, cst.GeneratorExp)):  # fmt: skip
        return False
    return "\n" in code_of(node)


def parenthesized(node: cst.BaseExpression) -> cst.BaseExpression:
    """`node` in parentheses (once)."""
    if node.lpar:
        return node
    return node.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])


def as_receiver(node: cst.BaseExpression) -> cst.BaseExpression:
    """`node` ready to have `.method()` appended: `a + b` -> `(a + b)`."""
    if isinstance(node, _ATOMS) and not _breaks_line_outside_brackets(node):
        return node
    return parenthesized(node)


def replacing(
    call: cst.Call, parent: cst.CSTNode | None, node: cst.BaseExpression
) -> cst.BaseExpression:
    """`node` written where `call` stood, with parentheses only where needed."""
    if call.lpar:
        return node.with_changes(lpar=call.lpar, rpar=call.rpar)
    if _breaks_line_outside_brackets(node):
        return parenthesized(node)
    if isinstance(node, _ATOMS) or isinstance(parent, _OPEN_CONTEXTS):
        return node
    return parenthesized(node)
