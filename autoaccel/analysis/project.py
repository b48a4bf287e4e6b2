"""The modules of a script's project: the script and the local modules it imports.

`convert train.py` follows imports to modules that live beside the script or in its
project (the nearest folder up with `pyproject.toml`, `setup.py`, `setup.cfg` or `.git`),
the way Python would find them when the script runs from its folder or the project is
installed: `from trainer import Trainer`, `import mingpt.model`, `from .data import
make_loaders`. Libraries (torch, numpy, ...) are never read.

The other way round, `entry_projects(trainer.py)` finds the scripts that import a module
(`train.py` beside it, or above its package): what such a script passes to the module's
functions (the model, its device, the loaders) is what the module works with.
"""

from __future__ import annotations

import re
import stat
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
MAX_SCRIPTS = 256  # files of a folder read to find the scripts that import a module
# A top-level line of a script that does something when it runs: the `__main__` test,
# a loop, a `with`, or a call statement (`main()`, `trainer.fit(loader)`).
_RUNS = re.compile(r"^(?:if\s+__name__\s*==|for\s|while\s|with\s|async\s|[\w.]+\()", re.MULTILINE)
_IMPORT_LINE = re.compile(r"^[ \t]*(?:from|import)\b[^\n]*", re.MULTILINE)


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
    """Where imports of the script are looked up: its folder, then its project root and
    the root's `src/` folder (the src layout: the project's packages are installed from
    there, and a script of theirs imports them by their names)."""
    folder = script.resolve().parent
    roots = [folder]
    for candidate in [folder, *folder.parents]:
        if any((candidate / marker).exists() for marker in _PROJECT_MARKERS):
            found = [candidate, candidate / "src"]
            roots += [r for r in found if r != folder and r.is_dir()]
            break
    return roots


def load_project(
    script: Path | None, tree: cst.Module, index: ModuleIndex | None = None
) -> Project:
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


def entry_projects(path: Path) -> list[tuple[Project, SourceModule]]:
    """The projects of the entry scripts that import the module at `path`, each with the
    module as that project reads it (its import name, package and a parse of the file on
    disk). A script is looked for beside the module, above its package, and in the
    project's root folder; one that another of them imports is not an entry (`train.py`
    runs `trainer.py`, which runs `data.py`: `train.py` is the entry of both)."""
    target = path.resolve()
    found: list[tuple[Project, SourceModule]] = []
    for candidate in _scripts_importing(target):
        project = _entry_project(str(candidate), *_stamp(candidate))
        module = (
            next((m for m in project.modules.values() if _is(m, target)), None) if project else None
        )
        if project is not None and module is not None:
            found.append((project, module))
    return [
        (project, module)
        for project, module in found
        if not any(
            _is(other_module, Path(project.script.path))  # type: ignore[arg-type]
            for other, _ in found
            if other is not project
            for other_module in other.modules.values()
        )
    ]


def _scripts_importing(target: Path) -> list[Path]:
    """The Python files of the folders an entry script of `target` may sit in whose text
    has an import naming `target`'s module and code that runs when it is started (cheap
    tests: `entry_projects` then follows their imports). A library module beside it,
    which only defines things, is no entry: reading its program would cost a whole
    analysis for every module of a library."""
    folder = target.parent
    name = folder.name if target.name == "__init__.py" else target.stem
    # A module of a package may be imported through the package (`from pkg import algo`,
    # whose `__init__.py` imports `.ppo`): the packages' names count too.
    names = {name}
    folders = [folder]
    while (folder / "__init__.py").is_file() and folder.parent != folder:
        names.add(folder.name)
        folder = folder.parent
        folders.append(folder)
    folders += [root for root in project_roots(target) if root not in folders]
    found = []
    for place in folders:
        try:
            scripts = sorted(place.glob("*.py"))[:MAX_SCRIPTS]
        except OSError:
            continue
        for script in scripts:
            try:
                status = script.stat()
                # a FIFO or a device named `x.py` would block the read
                if not stat.S_ISREG(status.st_mode) or status.st_size > MAX_BYTES:
                    continue
                if script.resolve() != target and not names.isdisjoint(
                    _entry_imports(str(script), status.st_mtime_ns, status.st_size)
                ):
                    found.append(script)
            except OSError:
                continue
    return found


@lru_cache(maxsize=4096)
def _entry_imports(path: str, mtime_ns: int, size: int) -> frozenset[str]:
    """The words of the import lines of the script at `path` when it runs something at
    top level (empty otherwise): read once per process for each version of the file,
    though every module of its folder asks."""
    text = Path(path).read_text(encoding="utf-8", errors="replace")
    if not _RUNS.search(text):
        return frozenset()
    return frozenset(
        word for line in _IMPORT_LINE.findall(text) for word in re.findall(r"\w+", line)
    )


def _stamp(path: Path) -> tuple[int, int]:
    try:
        status = path.stat()
    except OSError:
        return (0, 0)
    return (status.st_mtime_ns, status.st_size)


@lru_cache(maxsize=64)
def _entry_project(path: str, mtime_ns: int, size: int) -> Project | None:
    """The project of the script at `path` (None when it cannot be read or parsed), once
    per process for each version of the file: linting a folder asks it for every module
    the script imports."""
    try:
        script = _parsed(SCRIPT, path, Path(path).read_bytes())
    except (OSError, cst.ParserSyntaxError, RecursionError):
        return None
    return load_project(Path(path), script.tree, script.index)


def _is(module: SourceModule, target: Path) -> bool:
    return module.path is not None and Path(module.path).resolve() == target.resolve()
