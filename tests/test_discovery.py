"""Which files `autoaccel lint DIR` looks at."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from autoaccel.discovery import discover

needs_git = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")


def make(root: Path, *names: str) -> None:
    for name in names:
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("import torch\n")


def relative(paths: list[Path], root: Path) -> list[str]:
    return [path.relative_to(root).as_posix() for path in paths]


def test_directories_are_walked_recursively_and_sorted(tmp_path):
    make(tmp_path, "b.py", "a.py", "pkg/sub/deep.py", "pkg/mod.py", "notes.txt", "data.pyc")
    assert relative(discover([str(tmp_path)]), tmp_path) == [
        "a.py",
        "b.py",
        "pkg/mod.py",
        "pkg/sub/deep.py",
    ]


def test_caches_and_virtualenvs_are_skipped(tmp_path):
    make(
        tmp_path,
        "train.py",
        ".git/hooks/x.py",
        ".venv/lib/site.py",
        "venv/lib/site.py",
        "pkg/__pycache__/mod.py",
        ".tox/py/x.py",
        "node_modules/x.py",
        "myenv/lib/python3.11/site-packages/torch/x.py",
    )
    (tmp_path / "myenv" / "pyvenv.cfg").write_text("home = /usr/bin\n")
    assert relative(discover([str(tmp_path)]), tmp_path) == ["train.py"]


def test_a_file_named_explicitly_is_kept(tmp_path):
    make(tmp_path, ".venv/script.py", "notes.txt")
    explicit = [str(tmp_path / ".venv" / "script.py"), str(tmp_path / "notes.txt")]
    assert discover(explicit) == sorted(Path(p) for p in explicit)


def test_paths_are_unique(tmp_path):
    make(tmp_path, "a.py")
    assert discover([str(tmp_path), str(tmp_path / "a.py")]) == [tmp_path / "a.py"]


@needs_git
def test_gitignored_files_and_folders_are_skipped(tmp_path):
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / ".gitignore").write_text("generated/\n*_tmp.py\n")
    make(tmp_path, "train.py", "train_tmp.py", "generated/model.py", "src/ok.py", "src/x_tmp.py")
    assert relative(discover([str(tmp_path)]), tmp_path) == ["src/ok.py", "train.py"]
    # From a sub-folder of the work tree too.
    assert relative(discover([str(tmp_path / "src")]), tmp_path) == ["src/ok.py"]


@needs_git
@pytest.mark.parametrize("name", ["ignoré_tmp.py", "line\nbreak_tmp.py", 'quote"_tmp.py'])
def test_gitignored_names_git_would_quote_are_skipped(tmp_path, name):
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / ".gitignore").write_text("*_tmp.py\n")
    make(tmp_path, name, "kept.py")
    assert discover([str(tmp_path)]) == [tmp_path / "kept.py"]


@needs_git
def test_gitignored_file_named_explicitly_is_kept(tmp_path):
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / ".gitignore").write_text("*_tmp.py\n")
    make(tmp_path, "train_tmp.py")
    assert discover([str(tmp_path / "train_tmp.py")]) == [tmp_path / "train_tmp.py"]


def test_outside_a_git_work_tree_nothing_is_ignored(tmp_path):
    (tmp_path / ".gitignore").write_text("*.py\n")
    make(tmp_path, "train.py")
    # Not a work tree (tmp_path is not inside one), so .gitignore has no say.
    inside = (
        subprocess.run(
            ["git", "rev-parse", "--is-inside-work-tree"], cwd=tmp_path, capture_output=True
        )
        if shutil.which("git")
        else None
    )
    if inside is not None and inside.returncode == 0:
        pytest.skip("the temporary folder is inside a git work tree")
    assert relative(discover([str(tmp_path)]), tmp_path) == ["train.py"]
