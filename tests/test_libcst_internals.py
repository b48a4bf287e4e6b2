"""LibCST's private names appear in `autoaccel/cst_internals.py` only (see its docstring),
besides the classes that implement one of LibCST's own protocols, listed here with why."""

from __future__ import annotations

import ast
from pathlib import Path

import libcst as cst
from libcst.codemod import CodemodContext, VisitorBasedCodemodCommand
from libcst.matchers import MatcherDecoratableTransformer
from libcst.metadata import MetadataWrapper

from autoaccel.cst_internals import CodegenState

PACKAGE = Path(__file__).resolve().parent.parent / "autoaccel"
INTERNALS = PACKAGE / "cst_internals.py"

# (module, private name) -> why that module may define or use it.
PROTOCOL_USES = {
    (
        "long_strings.py",
        "_visit_and_replace_children",
    ): "a node type of its own (LibCST's node protocol)",
    ("long_strings.py", "_codegen_impl"): "a node type of its own (LibCST's node protocol)",
    ("long_strings.py", "_parenthesize"): "a node type of its own writes its parentheses",
    ("convert/transform.py", "_handle_metadata_reference"): "the codemod hook that copies the tree",
}


def libcst_private_names() -> set[str]:
    """The single-underscore names LibCST's classes and their instances carry (the ones
    autoaccel's code touches: nodes, transformers, codemods, metadata, code generation)."""

    class Command(VisitorBasedCodemodCommand):
        pass

    module = cst.parse_module("(x)\n")
    objects = [
        module,
        module.body[0],
        cst.Name("x"),
        cst.SimpleString('""'),
        MatcherDecoratableTransformer(),
        Command(CodemodContext()),
        MetadataWrapper(module),
        CodegenState("    ", "\n"),
    ]
    return {
        name
        for found in objects
        for name in dir(found)
        if name.startswith("_") and not name.startswith("__") and name not in vars(object)
    } - {
        "_abc_impl",
        "_is_protocol",
    }  # Python's own, on any ABC


def private_uses(path: Path, names: set[str]) -> set[str]:
    """The private LibCST names `path` defines, reads or imports from a private module."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Attribute) and node.attr in names:
            found.add(node.attr)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name in names:
            found.add(node.name)
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("libcst"):
            found.update(part for part in node.module.split(".") if part.startswith("_"))
        elif isinstance(node, ast.Import):
            found.update(
                part
                for alias in node.names
                if alias.name.startswith("libcst")
                for part in alias.name.split(".")
                if part.startswith("_")
            )
    return found


def test_the_private_names_are_known():
    """The scan knows the names this module's allowances are about (a LibCST release
    that renames them makes this fail, not the scan go blind)."""
    names = libcst_private_names()
    assert {"_codegen", "_extra_visit_funcs", "_matchers", "_codegen_impl"} <= names
    assert {name for _, name in PROTOCOL_USES} <= names


def test_only_cst_internals_reaches_into_libcst():
    names = libcst_private_names()
    outside = sorted(
        f"{path.relative_to(PACKAGE)}: {name}"
        for path in PACKAGE.rglob("*.py")
        if path != INTERNALS
        for name in private_uses(path, names)
        if (path.relative_to(PACKAGE).as_posix(), name) not in PROTOCOL_USES
    )
    assert outside == []


def test_the_scan_sees_each_kind_of_use(tmp_path):
    script = tmp_path / "uses.py"
    script.write_text(
        "from libcst._nodes.internal import CodegenState\n"
        "import libcst._parser.entrypoints\n"
        "def f(node, state):\n"
        "    node._codegen(state)\n"
        "class Node:\n"
        "    def _codegen_impl(self, state): ...\n"
    )
    assert private_uses(script, libcst_private_names()) == {
        "_nodes",
        "_parser",
        "_codegen",
        "_codegen_impl",
    }
