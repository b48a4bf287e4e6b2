"""Which files a change touches: a git diff against the base the CI event names.

Every diff passes `--no-textconv` and `--no-ext-diff`: a `diff.<driver>.textconv` or
`diff.external` of the repository's configuration is a command, which git would run on
the pull request's files (chosen by its `.gitattributes`)."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from collections.abc import Mapping

from autoaccel.git import git

NO_COMMIT = "0" * 40  # `before` of a push that created the branch


def base_revision(env: Mapping[str, str], explicit: str = "") -> str | None:
    """What to diff against: `explicit`, else the pull request's base commit, else the
    commit before a push, else `origin/$GITHUB_BASE_REF`; None when there is none."""
    if explicit:
        return explicit
    event_path = env.get("GITHUB_EVENT_PATH")
    event = (
        json.loads(Path(event_path).read_text())
        if event_path and os.path.isfile(event_path)
        else {}
    )
    pull_base = (event.get("pull_request") or {}).get("base", {}).get("sha")
    if pull_base:
        return pull_base
    before = event.get("before")
    if before and before != NO_COMMIT:
        return before
    if env.get("GITHUB_BASE_REF"):
        return f"origin/{env['GITHUB_BASE_REF']}"
    return None


def _since(repo: Path, base: str) -> str:
    """The merge base of `base` and HEAD (what a pull request's diff starts from)."""
    commit = _commit(repo, base)
    merge_base = git("merge-base", commit, "HEAD", cwd=repo)
    return merge_base.stdout.strip() if merge_base.returncode == 0 else commit


def changed_files(repo: Path, base: str | None, suffixes: tuple[str, ...]) -> list[Path]:
    """Files with one of `suffixes` that were added, copied, modified or renamed since
    the merge base of `base` and HEAD (every tracked file when `base` is None), sorted."""
    if base is None:
        listing = git("ls-files", "-z", cwd=repo)
    else:
        listing = git(
            "diff",
            "-z",
            "--name-only",
            "--no-ext-diff",
            "--no-textconv",
            "--diff-filter=ACMR",
            _since(repo, base),
            "HEAD",
            cwd=repo,
        )
    if listing.returncode != 0:
        raise RuntimeError(f"git could not list the changed files: {listing.stderr.strip()}")
    names = [name for name in listing.stdout.split("\0") if name.endswith(suffixes)]
    return sorted(Path(name) for name in names if (repo / name).is_file())


def links_out_of(repo: Path, files: list[Path]) -> list[Path]:
    """The `files` (relative to `repo`) that are, or lie under, a symbolic link to a
    place outside `repo`: reading them would read the runner's files, not the change's."""
    root = repo.resolve()
    return [path for path in files if not (repo / path).resolve().is_relative_to(root)]


def configs_out_of(repo: Path, files: list[Path]) -> dict[Path, Path]:
    """The `files` (relative to `repo`) whose settings could come from a pyproject.toml
    of the checkout that is a symbolic link out of it (in their folder or one above),
    each with that pyproject.toml: reading it would read the runner's files."""
    root = repo.resolve()
    found = {}
    for path in files:
        for folder in path.parents:
            config = folder / "pyproject.toml"
            if (repo / config).is_symlink() and not (repo / config).resolve().is_relative_to(root):
                found[path] = config
                break
    return found


_NEW_FILE = re.compile(r"^\+\+\+ b/(?P<path>.*)$")
_HUNK = re.compile(r"^@@ -\d+(?:,\d+)? \+(?P<start>\d+)(?:,(?P<count>\d+))? @@")


def changed_lines(repo: Path, base: str) -> dict[Path, set[int]]:
    """The lines (1-based, in HEAD) that each file added or changed since the merge base
    of `base` and HEAD; a file missing from the result could not be read from the diff."""
    diff = git(
        "-c",
        "core.quotePath=false",
        "diff",
        "--no-color",
        "--no-ext-diff",
        "--no-textconv",
        "-U0",
        "--diff-filter=ACMR",
        _since(repo, base),
        "HEAD",
        cwd=repo,
    )
    if diff.returncode != 0:
        raise RuntimeError(f"git could not diff against {base}: {diff.stderr.strip()}")
    lines: dict[Path, set[int]] = {}
    current: set[int] | None = None
    in_header = False  # between `diff --git` and the first hunk; lines in hunks start +, -, ' '
    for text in diff.stdout.split("\n"):  # not splitlines(): a `\f` in a line is no break
        if text.startswith("diff --git "):
            in_header, current = True, None
        elif in_header and (new_file := _NEW_FILE.match(text)):
            current = lines.setdefault(Path(new_file["path"]), set())
        elif hunk := _HUNK.match(text):
            in_header = False
            if current is not None:
                start, count = int(hunk["start"]), int(hunk["count"] or 1)
                current.update(range(start, start + count))
    return lines


def _commit(repo: Path, revision: str) -> str:
    """The SHA of `revision`, an input of the workflow: read after --end-of-options it
    is a revision, never an option (`--output=FILE` would make git write a file)."""
    found = git(
        "rev-parse", "--verify", "--quiet", "--end-of-options", f"{revision}^{{commit}}", cwd=repo
    )
    if found.returncode != 0:
        raise RuntimeError(f"git does not know the base revision {revision!r}")
    return found.stdout.strip()
