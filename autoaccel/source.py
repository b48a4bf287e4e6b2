"""Source text as every command reads it: parsed once by CPython and by LibCST, with
CPython's messages for errors and a guard against nesting that would crash LibCST's
native parser; the compile check of generated code; the cheap prefilter."""

from __future__ import annotations

import ast
import signal
import threading
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import libcst as cst

from autoaccel.long_strings import long_concatenations, put_back, with_stand_ins


class SourceError(Exception):
    """A file that cannot be parsed; `line`/`column` are 1-based."""

    def __init__(self, message: str, line: int, column: int) -> None:
        super().__init__(message)
        self.message = message
        self.line = line
        self.column = column


# LibCST's parser is native code: about 1,500 nested brackets, or 10,000 `and`s or
# dotted names in one expression, overflow its C stack and kill the process (a
# segfault: no traceback, no other file reported). A source nested deeper than this
# is refused before LibCST sees it; real scripts stay under 30.
MAX_NESTING = 500
TOO_DEEP = "too deeply nested for autoaccel"


def parse(source: str) -> cst.Module:
    """Parse `source`, turning a syntax error into a located `SourceError`."""
    return parse_checked(source)[0]


def parse_checked(source: str) -> tuple[cst.Module, ast.Module | None]:
    """`source` parsed by LibCST, and by CPython when it could (`None` for null bytes).
    CPython's parser reads it first: its messages and positions are the ones users know
    (LibCST's point past the error), and it measures the nesting LibCST would crash on."""
    tree = checked_syntax_tree(source)
    long_strings = long_concatenations(source, tree) if tree is not None else []
    try:
        with interruptible():
            module = cst.parse_module(with_stand_ins(source, long_strings))
    except cst.ParserSyntaxError as error:
        message = error.message.strip().splitlines()[0] if error.message else "invalid syntax"
        raise SourceError(f"SyntaxError: {message}", error.raw_line, error.raw_column + 1) from None
    return (put_back(module, source, long_strings) if long_strings else module), tree


@contextmanager
def interruptible() -> Iterator[None]:
    """Ctrl-C ends the process at once (the signal's default action), for code that
    writes nothing: Python's handler waits for LibCST's native parser (5 s for 1 MB),
    and then for the freeing of every node at exit (3 s)."""
    if threading.current_thread() is not threading.main_thread() or (
        signal.getsignal(signal.SIGINT) is not signal.default_int_handler
    ):
        yield
        return
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def checked_syntax_tree(source: str) -> ast.Module | None:
    """CPython's tree of `source`, or None when it cannot say (null bytes, which LibCST
    then reports). Raises CPython's error, or one for a nesting past `MAX_NESTING`."""
    try:
        tree = compile_quietly(source, "<lint>", ast.PyCF_ONLY_AST)
    except SyntaxError as error:
        raise SourceError(
            f"SyntaxError: {error.msg}", error.lineno or 1, error.offset or 1
        ) from None
    except (RecursionError, MemoryError):
        raise SourceError(f"{TOO_DEEP} (Python's own parser gave up)", 1, 1) from None
    except ValueError:
        return None
    stack: list[tuple[ast.AST, int]] = [(tree, 0)]
    while stack:
        node, depth = stack.pop()
        depth += _libcst_levels(node)
        if depth > MAX_NESTING:
            line, column = getattr(node, "lineno", 1), getattr(node, "col_offset", 0) + 1
            raise SourceError(f"{TOO_DEEP}: over {MAX_NESTING} nested levels", line, column)
        if depth + _most_levels_within(node) > MAX_NESTING:
            stack.extend((child, depth) for child in ast.iter_child_nodes(node))
    return tree


def _most_levels_within(node: ast.AST) -> int:
    """An upper bound of the levels below `node`: three per character of a one-line
    node (every level writes a character, or wraps one that does: a context, an `Expr`,
    `arguments`), unbounded for the others."""
    end = getattr(node, "end_col_offset", None)
    if end is None or node.lineno != node.end_lineno:  # type: ignore[attr-defined]
        return MAX_NESTING
    return 3 * (end - node.col_offset) + 3  # type: ignore[attr-defined]


def compile_quietly(source: str, filename: str, flags: int = 0) -> Any:
    """`compile(source)` without the SyntaxWarnings CPython prints about the user's
    code (`1if x else 2`, `"\\d"`): they are not autoaccel's to report."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return compile(source, filename, "exec", flags=flags, dont_inherit=True)


def python_tree(source: str) -> ast.Module | None:
    """CPython's syntax tree of `source`, without its warnings about the user's code;
    None where CPython rejects it (or cannot say: null bytes)."""
    try:
        return compile_quietly(source, "<autoaccel>", ast.PyCF_ONLY_AST)
    except (SyntaxError, ValueError):
        return None


def _libcst_levels(node: ast.AST) -> int:
    """How many levels LibCST nests `node` in: `a and b and c` is one `ast.BoolOp` but
    nested `BooleanOperation`s, and the dotted name of an import nested `Attribute`s."""
    if isinstance(node, ast.BoolOp):
        return len(node.values) - 1
    if isinstance(node, ast.alias):
        return node.name.count(".") + 1
    if isinstance(node, ast.ImportFrom):
        return (node.module or "").count(".") + 1
    return 1


def might_use_torch(source: str) -> bool:
    """Cheap prefilter: a file that never says `torch` has nothing for the rules."""
    return "torch" in source
