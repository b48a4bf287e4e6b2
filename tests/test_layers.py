"""The import contract of `autoaccel/` (docs/architecture.md): every module has a layer, no
module imports one of a higher layer, and no modules import each other in a cycle.
Imports inside functions and under `TYPE_CHECKING` count like the others."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "autoaccel"

# Bottom to top; a module (named from `autoaccel.`, its longest listed prefix) may import
# its own layer and those below. docs/architecture.md mirrors this table.
LAYERS: list[tuple[str, ...]] = [
    # Files, text and settings: no parsing, no analysis.
    (
        "__init__",
        "config",
        "console",
        "cst_edit",
        "diff",
        "discovery",
        "docs",
        "fileio",
        "git",
        "markdown",
        "cst_internals",
        "module_code",
        "notebook",
        "patching",
    ),
    # Parsing: what every command reads a file through.
    ("long_strings", "source"),
    # What a script does, statically (analysis) or from a short run (facts).
    ("analysis", "facts", "formatting"),
    # Rules and the linter; running a script in a child process.
    ("lint", "rules", "run"),
    # The conversion, which the other commands reuse.
    ("convert",),
    ("bench", "ci", "config_report", "tune"),
    # The command line.
    ("cli", "__main__"),
]
# No upward import is allowed (the rule catalog reaches the config loader through
# `config.use_rule_catalog`, which `autoaccel.rules` calls).
ALLOWED_UPWARD: set[tuple[str, str]] = set()


def module_names() -> dict[str, Path]:
    """Every module of the package, named from `autoaccel.` (`__init__` for the package)."""
    names = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        if parts[-1] == "__init__" and len(parts) > 1:
            parts = parts[:-1]
        names[".".join(parts)] = path
    return names


def imports(modules: dict[str, Path]) -> dict[str, set[str]]:
    """The modules of the package each module imports, wherever the import statement is."""
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        dotted = "autoaccel" if name == "__init__" else f"autoaccel.{name}"
        package = dotted if path.name == "__init__.py" else dotted.rpartition(".")[0]
        imported: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                imported.update(_known(alias.name, modules) for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = _absolute(node, package)
                for alias in node.names:  # `from autoaccel.x import submodule`
                    imported.add(_known(f"{base}.{alias.name}", modules))
        graph[name] = {module for module in imported if module and module != name}
    return graph


def _absolute(node: ast.ImportFrom, package: str) -> str:
    if not node.level:
        return node.module or ""
    base = package.split(".")[: package.count(".") + 2 - node.level]
    return ".".join([*base, *([node.module] if node.module else [])])


def _known(dotted: str, modules: dict[str, Path]) -> str:
    """The module of the package that `dotted` names or lies in ("" outside it)."""
    if dotted == "autoaccel":
        return "__init__"
    name = dotted.removeprefix("autoaccel.") if dotted.startswith("autoaccel.") else ""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or ("__init__" if dotted.startswith("autoaccel.") else "")


def layer(module: str) -> int | None:
    """The index in `LAYERS` of `module`'s longest listed prefix (None when none is)."""
    found = [
        (len(prefix), index)
        for index, prefixes in enumerate(LAYERS)
        for prefix in prefixes
        if module == prefix or module.startswith(prefix + ".")
    ]
    return max(found)[1] if found else None


def cycles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[set[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for other in graph[module]:
            if other not in index:
                visit(other)
                low[module] = min(low[module], low[other])
            elif other in stack:
                low[module] = min(low[module], index[other])
        if low[module] == index[module]:
            component = {stack.pop()}
            while module not in component:
                component.add(stack.pop())
            if len(component) > 1:
                found.append(component)

    for module in graph:
        if module not in index:
            visit(module)
    return found


def test_every_module_has_a_layer():
    assert [module for module in module_names() if layer(module) is None] == []


def test_no_module_imports_a_higher_layer():
    graph = imports(module_names())
    upward = sorted(
        f"{module} (layer {layer(module)}) imports {other} (layer {layer(other)})"
        for module, others in graph.items()
        for other in others
        if (layer(other) or 0) > (layer(module) or 0) and (module, other) not in ALLOWED_UPWARD
    )
    assert upward == []


def test_no_import_cycles():
    assert cycles(imports(module_names())) == []


def test_the_checks_see_function_local_and_relative_imports(tmp_path):
    """The graph counts an import inside a function, and a relative one, as an edge."""
    package = tmp_path / "autoaccel"
    (package / "lint").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "fileio.py").write_text("def f():\n    from autoaccel.lint import engine\n")
    (package / "lint" / "__init__.py").write_text("")
    (package / "lint" / "engine.py").write_text("from ..fileio import f\n")
    modules = {
        "__init__": package / "__init__.py",
        "fileio": package / "fileio.py",
        "lint": package / "lint" / "__init__.py",
        "lint.engine": package / "lint" / "engine.py",
    }
    graph = imports(modules)
    assert graph["fileio"] == {"lint.engine"}
    assert graph["lint.engine"] == {"fileio"}
    assert cycles(graph) == [{"fileio", "lint.engine"}]
    assert layer("lint.engine") > layer("fileio")
