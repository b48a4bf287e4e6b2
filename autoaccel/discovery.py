"""Which files a command looks at: paths given, directories walked like Ruff does."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path
from collections.abc import Callable, Iterable

from autoaccel.fileio import file_kind, real_path
from autoaccel.git import git

SKIPPED_DIRECTORIES = frozenset(
    {
        ".git",
        ".hg",
        ".svn",
        "__pycache__",
        ".venv",
        "venv",
        ".tox",
        ".nox",
        ".eggs",
        ".mypy_cache",
        ".pytest_cache",
        ".ruff_cache",
        "node_modules",
        "site-packages",
        "build",
        "dist",
        ".ipynb_checkpoints",
    }
)
SOURCE_SUFFIXES = (".py", ".ipynb")


def discover(
    paths: Iterable[str],
    excluded: Callable[[Path], bool] = lambda path: False,
    unreadable: Callable[[OSError], None] = lambda error: None,
) -> list[Path]:
    """Files to lint, sorted and unique. Files named explicitly are always kept;
    directories are searched recursively, honouring `.gitignore` inside a git work
    tree, skipping virtual environments, caches and what `excluded` says (files and
    folders met on the way, not the paths given). A folder that cannot be listed is
    passed to `unreadable`; a FIFO, socket, device or broken link met on the way is
    skipped with a warning on stderr (Ruff's way)."""
    found: set[Path] = set()
    for raw in paths:
        path = Path(raw)
        if os.path.isdir(path):
            found.update(_walk(path, excluded, unreadable))
        else:
            found.add(path)
    return sorted(found)


def _walk(
    root: Path, excluded: Callable[[Path], bool], unreadable: Callable[[OSError], None]
) -> Iterable[Path]:
    ignored = _git_ignored(root)
    for directory, subdirectories, files in os.walk(root, onerror=unreadable):
        here = Path(directory)
        subdirectories[:] = sorted(
            name
            for name in subdirectories
            if name not in SKIPPED_DIRECTORIES
            and not os.path.exists(here / name / "pyvenv.cfg")
            and real_path(here / name) not in ignored
            and not excluded(here / name)
        )
        for name in files:
            candidate = here / name
            if (
                name.endswith(SOURCE_SUFFIXES)
                and real_path(candidate) not in ignored
                and not excluded(candidate)
                and _worth_reading(candidate)
            ):
                yield candidate


def _worth_reading(path: Path) -> bool:
    """Whether a file met on the walk is read: a regular file, or one whose kind only
    reading can tell (the read reports why it fails); the others are named in a warning."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        print(f"warning: {path}: a broken symbolic link; skipped", file=sys.stderr)
        return False
    except OSError:
        return True
    if stat.S_ISREG(mode):
        return True
    print(f"warning: {path}: {file_kind(mode)}; skipped", file=sys.stderr)
    return False


def _git_ignored(root: Path) -> frozenset[Path]:
    """Paths under `root` that git ignores (empty outside a work tree or without git)."""
    try:
        result = git(
            "ls-files",
            "-z",
            "--others",
            "--ignored",
            "--exclude-standard",
            "--directory",
            cwd=root,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return frozenset()
    if result.returncode != 0:
        return frozenset()
    # -z: names as they are (not C-quoted: "ignor\303\251.py"), a newline in one included
    return frozenset(
        real_path(root / name.rstrip("/")) for name in result.stdout.split("\0") if name
    )
