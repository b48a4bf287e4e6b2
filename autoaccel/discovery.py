"""Which files a command looks at: paths given, directories walked like Ruff does."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Callable, Iterable

from autoaccel.fileio import real_path
from autoaccel.git import git

SKIPPED_DIRECTORIES = frozenset(
    {".git", ".hg", ".svn", "__pycache__", ".venv", "venv", ".tox", ".nox", ".eggs",
     ".mypy_cache", ".pytest_cache", ".ruff_cache", "node_modules", "site-packages",
     "build", "dist", ".ipynb_checkpoints"}
)
SOURCE_SUFFIXES = (".py", ".ipynb")


def discover(
    paths: Iterable[str], excluded: Callable[[Path], bool] = lambda path: False
) -> list[Path]:
    """Files to lint, sorted and unique. Files named explicitly are always kept;
    directories are searched recursively, honouring `.gitignore` inside a git work
    tree, skipping virtual environments, caches and what `excluded` says (files and
    folders met on the way, not the paths given)."""
    found: set[Path] = set()
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            found.update(_walk(path, excluded))
        else:
            found.add(path)
    return sorted(found)


def _walk(root: Path, excluded: Callable[[Path], bool]) -> Iterable[Path]:
    ignored = _git_ignored(root)
    for directory, subdirectories, files in os.walk(root):
        here = Path(directory)
        subdirectories[:] = sorted(
            name
            for name in subdirectories
            if name not in SKIPPED_DIRECTORIES
            and not (here / name / "pyvenv.cfg").exists()
            and real_path(here / name) not in ignored
            and not excluded(here / name)
        )
        for name in files:
            candidate = here / name
            if (
                name.endswith(SOURCE_SUFFIXES)
                and real_path(candidate) not in ignored
                and not excluded(candidate)
            ):
                yield candidate


def _git_ignored(root: Path) -> frozenset[Path]:
    """Paths under `root` that git ignores (empty outside a work tree or without git)."""
    try:
        result = git(
            "ls-files", "--others", "--ignored", "--exclude-standard", "--directory",
            cwd=root,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return frozenset()
    if result.returncode != 0:
        return frozenset()
    return frozenset(real_path(root / line.rstrip("/")) for line in result.stdout.splitlines())
