"""The hooks in .pre-commit-hooks.yaml, run the way pre-commit runs them: the entry
with the staged Python files appended, from the root of the repository."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml  # a dependency of libcst, so always installed with autoaccel
from conftest import CLEAN, SCRIPT
from running import FIXTURES_DIR

ROOT = Path(__file__).resolve().parent.parent
HOOKS = {hook["id"]: hook for hook in yaml.safe_load((ROOT / ".pre-commit-hooks.yaml").read_text())}

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")


def test_hook_definitions():
    assert set(HOOKS) == {"autoaccel", "autoaccel-fix"}
    assert HOOKS["autoaccel"]["entry"] == "autoaccel lint --force-exclude --precise"
    assert HOOKS["autoaccel-fix"]["entry"] == "autoaccel lint --fix --force-exclude --precise"
    for hook in HOOKS.values():
        assert hook["language"] == "python"
        assert hook["types_or"] == ["python", "jupyter"]
        assert hook["require_serial"] is False


def git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args],
        cwd=repo,
        check=True,
        capture_output=True,
        text=True,
    ).stdout


def staged_python_files(repo: Path) -> list[str]:
    """What pre-commit passes for `types_or: [python, jupyter]`: staged scripts and notebooks."""
    names = git(repo, "diff", "--cached", "--name-only", "--diff-filter=ACMR").split()
    return [name for name in names if name.endswith((".py", ".ipynb"))]


def run_hook(hook_id: str, repo: Path) -> subprocess.CompletedProcess[str]:
    argv = shlex.split(HOOKS[hook_id]["entry"])
    # pre-commit runs the console script installed into the hook's environment.
    executable = Path(sys.executable).parent / argv[0]
    command = [str(executable)] if executable.exists() else [sys.executable, "-m", "autoaccel"]
    return subprocess.run(
        [*command, *argv[1:], *staged_python_files(repo)],
        cwd=repo,
        capture_output=True,
        text=True,
        env={**os.environ, "CI": "true"},
        stdin=subprocess.DEVNULL,
    )


@pytest.fixture
def repo(tmp_path):
    git(tmp_path, "init", "-q")
    (tmp_path / "pyproject.toml").write_text('[tool.autoaccel]\nselect = ["ACC101", "ACC102"]\n')
    (tmp_path / "train.py").write_text(SCRIPT)
    (tmp_path / "clean.py").write_text(CLEAN)
    (tmp_path / "unstaged.py").write_text(SCRIPT)
    (tmp_path / "notes.md").write_text("DataLoader(ds)\n")
    notebook = {
        "cells": [
            {
                "cell_type": "code",
                "metadata": {},
                "outputs": [],
                "execution_count": None,
                "source": SCRIPT.splitlines(keepends=True),
            }
        ],
        "metadata": {"language_info": {"name": "python"}},
        "nbformat": 4,
        "nbformat_minor": 5,
    }
    (tmp_path / "explore.ipynb").write_text(json.dumps(notebook))
    git(tmp_path, "add", "pyproject.toml", "train.py", "clean.py", "notes.md", "explore.ipynb")
    return tmp_path


def test_lint_hook_fails_on_findings_in_staged_files(repo):
    run = run_hook("autoaccel", repo)
    assert run.returncode == 1
    assert "train.py:4:10: ACC101" in run.stdout
    assert "explore.ipynb:cell 1:4:10: ACC101" in run.stdout
    assert "unstaged.py" not in run.stdout
    assert (repo / "train.py").read_text() == SCRIPT


def test_lint_hook_skips_staged_test_code(repo):
    git(repo, "rm", "-q", "--cached", "train.py", "explore.ipynb")
    (repo / "tests").mkdir()
    (repo / "tests" / "test_data.py").write_text(SCRIPT)
    git(repo, "add", "tests/test_data.py")
    run = run_hook("autoaccel", repo)
    assert (run.returncode, run.stdout) == (0, ""), run.stderr


def test_lint_hook_passes_on_clean_files(repo):
    git(repo, "rm", "-q", "--cached", "train.py", "explore.ipynb")
    run = run_hook("autoaccel", repo)
    assert (run.returncode, run.stdout) == (0, ""), run.stderr


def test_fix_hook_rewrites_staged_files(repo):
    run = run_hook("autoaccel-fix", repo)
    # The safe fix is applied; the unsafe ACC101 stays and fails the commit.
    assert run.returncode == 1
    assert "pin_memory=torch.cuda.is_available()" in (repo / "train.py").read_text()
    cell = json.loads((repo / "explore.ipynb").read_text())["cells"][0]
    assert "pin_memory=torch.cuda.is_available()" in "".join(cell["source"])
    assert (repo / "unstaged.py").read_text() == SCRIPT
    assert "Found 4 errors (2 fixed, 2 remaining)." in run.stderr  # a script and a notebook


@pytest.fixture
def plain_repo(tmp_path):
    """A repository without autoaccel settings holding a plain float32 training script
    (the hooks' defaults decide what a commit of it must pass)."""
    git(tmp_path, "init", "-q")
    (tmp_path / "train.py").write_text((FIXTURES_DIR / "cnn_toplevel.py").read_text())
    git(tmp_path, "add", "train.py")
    return tmp_path


def test_fix_hook_passes_a_plain_float32_script_after_its_fixes(plain_repo):
    first = run_hook("autoaccel-fix", plain_repo)
    assert first.returncode == 0, first.stdout + first.stderr
    assert "pin_memory=torch.cuda.is_available()" in (plain_repo / "train.py").read_text()
    git(plain_repo, "add", "train.py")
    again = run_hook("autoaccel-fix", plain_repo)
    assert (again.returncode, again.stdout) == (0, "")
    assert (run_hook("autoaccel", plain_repo).returncode, again.stderr) == (
        0,
        "All checks passed!\n",
    )


def test_lint_hook_holds_only_precise_findings_and_lint_keeps_every_rule(plain_repo):
    hook = run_hook("autoaccel", plain_repo)
    assert hook.returncode == 1
    assert {line.split()[1] for line in hook.stdout.splitlines()} == {"ACC102"}
    everything = subprocess.run(
        [sys.executable, "-m", "autoaccel", "lint", "train.py"],
        cwd=plain_repo,
        capture_output=True,
        text=True,
    )
    assert {"ACC102", "ACC103", "ACC201"} <= {
        line.split()[1] for line in everything.stdout.splitlines()
    }


def test_hooks_keep_the_projects_select(plain_repo):
    (plain_repo / "pyproject.toml").write_text('[tool.autoaccel]\nselect = ["ACC201"]\n')
    run = run_hook("autoaccel-fix", plain_repo)
    assert run.returncode == 1
    assert {line.split()[1] for line in run.stdout.splitlines()} == {"ACC201"}


def test_hooks_add_the_projects_extend_select_to_the_precise_rules(plain_repo):
    (plain_repo / "pyproject.toml").write_text('[tool.autoaccel]\nextend-select = ["ACC103"]\n')
    run = run_hook("autoaccel", plain_repo)
    assert {line.split()[1] for line in run.stdout.splitlines()} == {"ACC102", "ACC103"}
