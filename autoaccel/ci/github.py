"""The GitHub Action (`action.yml`): lint the Python files a pull request or push
changes, with annotations on the diff, and preview what `autoaccel convert` would do
to the changed training scripts in the job summary and a PR comment file.

Run as `python -I -m autoaccel.ci.github` in the repository root (isolated: the
checkout's own modules are never imported). Inputs come from the
environment (`AUTOACCEL_*`, set by action.yml) besides GitHub's own `GITHUB_*`.
Exit code: the lint's (0 clean, 1 findings, 2 errors); 1 becomes 0 when
`AUTOACCEL_FAIL_ON_FINDINGS` is `false`.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shlex
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from autoaccel.ci.changes import base_revision, changed_files
from autoaccel.discovery import SOURCE_SUFFIXES
from autoaccel.markdown import code_block, inline_code

COMMENT_MARKER = "<!-- autoaccel -->"  # lets a workflow find and update its own comment
COMMENT_LIMIT = 65_000  # GitHub rejects comments over 65,536 characters
_ANNOTATION = re.compile(r"::error title=autoaccel \((?P<code>[A-Z]+\d+)\),file=(?P<file>[^,]*),")


@dataclass(frozen=True)
class Inputs:
    """The action's inputs, as action.yml passes them."""

    base: str = ""
    lint_args: str = ""
    convert_args: str = ""
    comment_file: str = ""
    fail_on_findings: bool = True

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Inputs:
        return cls(
            base=env.get("AUTOACCEL_BASE", ""),
            lint_args=env.get("AUTOACCEL_LINT_ARGS", ""),
            convert_args=env.get("AUTOACCEL_CONVERT_ARGS", ""),
            comment_file=env.get("AUTOACCEL_COMMENT_FILE", ""),
            fail_on_findings=env.get("AUTOACCEL_FAIL_ON_FINDINGS", "true").lower() != "false",
        )


def _autoaccel(*args: str) -> subprocess.CompletedProcess[str]:
    """Run autoaccel in isolated mode (`-I`): the working directory is the pull
    request's checkout, and a `typer.py` or `json.py` there must not be imported."""
    env = {**os.environ, "NO_COLOR": "1"}
    return subprocess.run(
        [sys.executable, "-I", "-m", "autoaccel", *args], capture_output=True, text=True, env=env
    )


def _log_untrusted(text: str) -> None:
    """Copy `text` (it quotes the pull request's file names and code) to the log with
    workflow commands off, so that a line `::error ...` in it is no annotation and
    `::add-mask::` or `::stop-commands::` change nothing. The token is unguessable."""
    if not text:
        return
    token = secrets.token_hex(16)
    sys.stderr.write(f"::stop-commands::{token}\n{text.rstrip(chr(10))}\n::{token}::\n")


def is_training_script(path: Path) -> bool:
    """Whether a training loop is found in `path` (a script or a notebook)."""
    import libcst as cst

    from autoaccel.analysis.script_model import LoopRole, build_script_model
    from autoaccel.fileio import read_source
    from autoaccel.lint.engine import SourceError, might_use_torch, parse
    from autoaccel.notebook import NotebookError, is_notebook, read_notebook

    try:
        text = read_notebook(path).python if is_notebook(path) else read_source(path).text
        if not might_use_torch(text):
            return False
        wrapper = cst.MetadataWrapper(parse(text), unsafe_skip_copy=True)
    except (OSError, UnicodeDecodeError, SyntaxError, SourceError, NotebookError):
        return False
    loops = build_script_model(wrapper).step_loops.values()
    return any(loop.role is LoopRole.TRAIN for loop in loops)


@dataclass(frozen=True)
class LintSummary:
    exit_code: int
    findings: int
    markdown: str


def lint_section(files: list[Path], lint_args: str) -> LintSummary:
    """Run `autoaccel lint --format github` (annotations go to the log) and sum up
    its findings per rule in Markdown."""
    from autoaccel.lint.output import DOCS_URL
    from autoaccel.rules import all_rules

    run = _autoaccel("lint", "--format", "github", *shlex.split(lint_args), "--", *map(str, files))
    sys.stdout.write(run.stdout)  # annotations, escaped by `--format github`
    _log_untrusted(run.stderr)
    found = [
        match.groupdict() for match in map(_ANNOTATION.match, run.stdout.splitlines()) if match
    ]
    counts = Counter(finding["code"] for finding in found)
    with_findings = len({finding["file"] for finding in found})
    lines = [
        f"**Lint**: {len(found)} finding{'s' * (len(found) != 1)} in {with_findings} of "
        f"{len(files)} changed file{'s' * (len(files) != 1)}"
        + (" (annotations on the diff)." if found else ".")
    ]
    if run.returncode == 2:
        lines.append(f"\n`autoaccel lint` reported errors:\n\n{code_block(run.stderr.strip())}")
    names = {rule.code: rule.name for rule in all_rules()}
    if counts:
        lines += ["", "| Rule | Findings |", "| --- | ---: |"]
        lines += [
            f"| [{code}]({DOCS_URL}{code}-{names.get(code, '')}.md) `{names.get(code, '')}` | {n} |"
            for code, n in sorted(counts.items())
        ]
    return LintSummary(run.returncode, len(found), "\n".join(lines) + "\n")


def convert_section(scripts: list[Path], convert_args: str) -> str:
    """`autoaccel convert --format markdown` of each training script (notebooks with
    `--to single`, the only target they support)."""
    if not scripts:
        return ""
    parts = ["### What `autoaccel convert` would change", ""]
    for script in scripts:
        extra = ["--to", "single"] if script.suffix == ".ipynb" else []
        run = _autoaccel(
            "convert", str(script), "--format", "markdown", *shlex.split(convert_args), *extra
        )
        if run.returncode == 0:
            parts.append(run.stdout)
        else:
            command = inline_code(f"autoaccel convert {script}")
            parts.append(f"{command} failed:\n\n{code_block(run.stderr.strip())}\n")
    return "\n".join(parts)


def _write_outputs(path: str | None, outputs: dict[str, str]) -> None:
    if not path:
        return
    with open(path, "a", encoding="utf-8") as stream:
        stream.writelines(f"{name}={value}\n" for name, value in outputs.items())


def _append(path: str | None, text: str) -> None:
    if path:
        with open(path, "a", encoding="utf-8") as stream:
            stream.write(text)


def _comment_path(inputs: Inputs, env: Mapping[str, str]) -> Path:
    if inputs.comment_file:
        return Path(inputs.comment_file)
    return Path(env.get("RUNNER_TEMP") or ".") / "autoaccel-comment.md"


def run_action(repo: Path, env: Mapping[str, str]) -> int:
    """Everything the action does, for the repository at `repo` (the working directory)."""
    inputs = Inputs.from_env(env)
    files = changed_files(repo, base_revision(env, inputs.base), SOURCE_SUFFIXES)
    body = [COMMENT_MARKER, "## autoaccel", ""]
    lint, scripts = LintSummary(0, 0, ""), []
    if files:
        lint = lint_section(files, inputs.lint_args)
        scripts = [path for path in files if is_training_script(path)]
        body += [lint.markdown, convert_section(scripts, inputs.convert_args)]
    else:
        body.append("No Python files or notebooks changed.\n")
    text = "\n".join(body)
    comment = (
        text
        if len(text) <= COMMENT_LIMIT
        else (
            text[:COMMENT_LIMIT]
            + "\n\n… cut at GitHub's comment size; the job summary has it all.\n"
        )
    )
    comment_path = _comment_path(inputs, env)
    comment_path.write_text(comment, encoding="utf-8")
    _append(env.get("GITHUB_STEP_SUMMARY"), text)
    _write_outputs(
        env.get("GITHUB_OUTPUT"),
        {
            "comment-file": str(comment_path),
            "changed-files": str(len(files)),
            "findings": str(lint.findings),
            "training-scripts": json.dumps([path.as_posix() for path in scripts]),
        },
    )
    return 0 if lint.exit_code == 1 and not inputs.fail_on_findings else lint.exit_code


def main() -> int:
    try:
        return run_action(Path.cwd(), os.environ)
    except RuntimeError as error:  # git could not list the changes
        print(f"autoaccel: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
