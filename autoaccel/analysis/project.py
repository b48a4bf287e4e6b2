"""The modules of a script's project: the script and the local modules it imports.

`convert train.py` follows imports to modules that live beside the script or in its
project (the nearest folder up with `pyproject.toml`, `setup.py`, `setup.cfg` or `.git`),
the way Python would find them when the script runs from its folder or the project is
installed: `from trainer import Trainer`, `import mingpt.model`, `from .data import
make_loaders`. Libraries (torch, numpy, ...) are never read.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import libcst as cst

from autoaccel.analysis.index import ModuleIndex
from autoaccel.analysis.program import SourceModule
from autoaccel.analysis.statements import statements

SCRIPT = "__main__"
_PROJECT_MARKERS = ("pyproject.toml", "setup.py", "setup.cfg", ".git")
MAX_MODULES = 64  # a script's own code, not a library vendored beside it
MAX_BYTES = 2_000_000


@dataclass
class Project:
    """A script and the local modules it imports, each parsed once."""

    script: SourceModule
    roots: list[Path]
    modules: dict[str, SourceModule] = field(default_factory=dict)  # by import name
    unreadable: dict[str, str] = field(default_factory=dict)  # import name -> why

    def resolve(self, dotted: str, origin: SourceModule) -> SourceModule | None:
        """The module of the project imported as `dotted` (None: a library)."""
        return self.modules.get(dotted)

    @property
    def all_modules(self) -> list[SourceModule]:
        return [self.script, *self.modules.values()]


def project_roots(script: Path) -> list[Path]:
    """Where imports of the script are looked up: its folder, then its project root."""
    folder = script.resolve().parent
    roots = [folder]
    for candidate in [folder, *folder.parents]:
        if any((candidate / marker).exists() for marker in _PROJECT_MARKERS):
            if candidate != folder:
                roots.append(candidate)
            break
    return roots


def load_project(script: Path | None, tree: cst.Module, index: ModuleIndex | None = None) -> Project:
    """The project of `script` (already parsed as `tree`, and indexed as `index` when
    given); a script without a path (standard input, a test string) is a project of
    one module."""
    main = SourceModule(SCRIPT, tree, index or ModuleIndex(tree), str(script) if script else None)
    project = Project(main, project_roots(script) if script is not None else [])
    if script is None:
        return project
    queue = [main]
    while queue and len(project.modules) < MAX_MODULES:
        module = queue.pop(0)
        for dotted in _imported_names(module):
            if dotted in project.modules or dotted in project.unreadable:
                continue
            path = _find(dotted, project.roots)
            if path is None or path.resolve() == script.resolve():
                continue
            loaded = _load(dotted, path, project)
            if loaded is not None:
                project.modules[dotted] = loaded
                queue.append(loaded)
    return project


def _load(dotted: str, path: Path, project: Project) -> SourceModule | None:
    try:
        if path.stat().st_size > MAX_BYTES:
            project.unreadable[dotted] = "too large to analyse"
            return None
        return _parsed(dotted, str(path), path.read_bytes())
    except (OSError, cst.ParserSyntaxError, RecursionError) as error:
        project.unreadable[dotted] = f"cannot be read: {type(error).__name__}"
        return None


@lru_cache(maxsize=256)
def _parsed(dotted: str, path: str, source: bytes) -> SourceModule:
    """A module parsed and indexed once per process for each text it has: linting a
    folder reads the modules its scripts share (`utils.py`) once."""
    tree = cst.parse_module(source)
    package = dotted if Path(path).name == "__init__.py" else dotted.rpartition(".")[0]
    return SourceModule(dotted, tree, ModuleIndex(tree), path, package)


def _find(dotted: str, roots: list[Path]) -> Path | None:
    relative = Path(*dotted.split("."))
    for root in roots:
        for candidate in (root / relative.with_suffix(".py"), root / relative / "__init__.py"):
            if candidate.is_file():
                return candidate
    return None


def _imported_names(module: SourceModule) -> Iterator[str]:
    """The dotted module names `module` imports (and, for `from a import b`, `a.b`, which
    may be a submodule), relative imports made absolute."""
    for node in _imports(module.tree):
        if isinstance(node, cst.Import):
            for alias in node.names:
                yield _dotted(alias.name)
            continue
        base = _dotted(node.module) if node.module is not None else ""
        if node.relative:
            package = module.package.split(".") if module.package else []
            package = package[: len(package) - len(node.relative) + 1]
            base = ".".join(p for p in [*package, base] if p)
        if base:
            yield base
        if not isinstance(node.names, cst.ImportStar):
            for alias in node.names:
                yield f"{base}.{_dotted(alias.name)}" if base else _dotted(alias.name)


def _imports(tree: cst.Module) -> Iterator[cst.Import | cst.ImportFrom]:
    """The imports of `tree`, wherever they sit (`try: import x`, inside `main()` or a
    loop), in source order."""
    for statement in statements(tree.body):
        if isinstance(statement, (cst.SimpleStatementLine, cst.SimpleStatementSuite)):
            for small in statement.body:
                if isinstance(small, (cst.Import, cst.ImportFrom)):
                    yield small


def _dotted(node: cst.BaseExpression) -> str:
    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute):
        return f"{_dotted(node.value)}.{node.attr.value}"
    return ""
