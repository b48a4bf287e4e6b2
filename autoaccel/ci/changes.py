"""Which files a change touches: a git diff against the base the CI event names."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Mapping

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


def changed_files(repo: Path, base: str | None, suffixes: tuple[str, ...]) -> list[Path]:
    """Files with one of `suffixes` that were added, copied, modified or renamed since
    the merge base of `base` and HEAD (every tracked file when `base` is None), sorted."""
    if base is None:
        listing = git("ls-files", "-z", cwd=repo)
    else:
        commit = _commit(repo, base)
        merge_base = git("merge-base", commit, "HEAD", cwd=repo)
        since = merge_base.stdout.strip() if merge_base.returncode == 0 else commit
        listing = git(
            "diff", "-z", "--name-only", "--no-ext-diff", "--diff-filter=ACMR", since, "HEAD",
            cwd=repo,
        )
    if listing.returncode != 0:
        raise RuntimeError(f"git could not list the changed files: {listing.stderr.strip()}")
    names = [name for name in listing.stdout.split("\0") if name.endswith(suffixes)]
    return sorted(Path(name) for name in names if (repo / name).is_file())


def _commit(repo: Path, revision: str) -> str:
    """The SHA of `revision`, an input of the workflow: read after --end-of-options it
    is a revision, never an option (`--output=FILE` would make git write a file)."""
    found = git(
        "rev-parse", "--verify", "--quiet", "--end-of-options", f"{revision}^{{commit}}", cwd=repo
    )
    if found.returncode != 0:
        raise RuntimeError(f"git does not know the base revision {revision!r}")
    return found.stdout.strip()
