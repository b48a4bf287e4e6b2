"""Which files a command looks at: paths given, directories walked like Ruff does."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Iterable

from autoaccel.fileio import real_path
from autoaccel.git import git

SKIPPED_DIRECTORIES = frozenset(
    {".git", ".hg", ".svn", "__pycache__", ".venv", "venv", ".tox", ".nox", ".eggs",
     ".mypy_cache", ".pytest_cache", ".ruff_cache", "node_modules", "site-packages",
     "build", "dist", ".ipynb_checkpoints"}
)
SOURCE_SUFFIXES = (".py", ".ipynb")


def discover(paths: Iterable[str]) -> list[Path]:
    """Files to lint, sorted and unique. Files named explicitly are always kept;
    directories are searched recursively, honouring `.gitignore` inside a git work
    tree and skipping virtual environments and caches."""
    found: set[Path] = set()
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            found.update(_walk(path))
        else:
            found.add(path)
    return sorted(found)


def _walk(root: Path) -> Iterable[Path]:
    ignored = _git_ignored(root)
    for directory, subdirectories, files in os.walk(root):
        here = Path(directory)
        subdirectories[:] = sorted(
            name
            for name in subdirectories
            if name not in SKIPPED_DIRECTORIES
            and not (here / name / "pyvenv.cfg").exists()
            and real_path(here / name) not in ignored
        )
        for name in files:
            candidate = here / name
            if name.endswith(SOURCE_SUFFIXES) and real_path(candidate) not in ignored:
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
