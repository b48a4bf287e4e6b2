"""The GitHub Action (`action.yml`): lint the Python files a pull request or push
changes, with annotations on the lines it changed, and preview what `autoaccel convert`
would do to the changed training scripts in the job summary and a PR comment file.

Only findings on the lines the change added or modified are annotated and fail the step
(the diff filter of reviewdog and of Ruff's own pre-commit use): a finding that was
there before is the change's context, counted but not held against it.

Run as `python -I -m autoaccel.ci.github` in the repository root (isolated: the
checkout's own modules are never imported). Inputs come from the
environment (`AUTOACCEL_*`, set by action.yml) besides GitHub's own `GITHUB_*`.
Exit code: 2 when the lint reported errors, else 1 for findings on changed lines (0 when
`AUTOACCEL_FAIL_ON_FINDINGS` is `false`), else 0.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from collections.abc import Mapping
from urllib.parse import quote

from autoaccel.ci.changes import (
    base_revision,
    changed_files,
    changed_lines,
    configs_out_of,
    links_out_of,
)
from autoaccel.convert.launch import shell_word
from autoaccel.discovery import SOURCE_SUFFIXES
from autoaccel.markdown import code_block, inline_code, table_cell

COMMENT_MARKER = "<!-- autoaccel -->"  # lets a workflow find and update its own comment
COMMENT_LIMIT = 65_000  # GitHub rejects comments over 65,536 characters
LISTED_FINDINGS = 50  # rows of the comment's table of findings
_ANNOTATION = re.compile(
    r"::error title=autoaccel \((?P<code>[A-Z]+\d+)\),file=(?P<file>[^,]*),line=(?P<line>\d+),"
    r".*::(?P<message>.*)$"
)


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
    from autoaccel.notebook import NotebookError, is_notebook, read_notebook
    from autoaccel.source import SourceError, might_use_torch, parse

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
class Finding:
    code: str
    file: str  # as the annotation has it (`%2C`-style escapes undone)
    line: int
    message: str
    annotation: str  # the workflow command that puts it on the diff


def _unescape(value: str) -> str:
    for escaped, raw in (("%2C", ","), ("%3A", ":"), ("%0A", "\n"), ("%0D", "\r"), ("%25", "%")):
        value = value.replace(escaped, raw)
    return value


def parse_annotations(text: str) -> list[Finding]:
    """The findings of `autoaccel lint --format github` output."""
    findings = []
    for line in text.splitlines():
        match = _ANNOTATION.match(line)
        if match:
            findings.append(
                Finding(
                    match["code"],
                    _unescape(match["file"]),
                    int(match["line"]),
                    _unescape(match["message"]),
                    line,
                )
            )
    return findings


@dataclass(frozen=True)
class LineLinks:
    """Links to lines of the files at the commit that was linted."""

    server: str  # https://github.com
    repository: str  # owner/name
    commit: str

    @classmethod
    def from_env(cls, env: Mapping[str, str], repo: Path) -> LineLinks | None:
        if not env.get("GITHUB_REPOSITORY"):
            return None
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True
        ).stdout.strip()
        server = env.get("GITHUB_SERVER_URL", "https://github.com")
        return cls(server, env["GITHUB_REPOSITORY"], head or env.get("GITHUB_SHA", "HEAD"))

    def url(self, finding: Finding) -> str:
        path = "/".join(quote(part) for part in Path(finding.file).parts)
        return f"{self.server}/{self.repository}/blob/{self.commit}/{path}#L{finding.line}"


@dataclass(frozen=True)
class LintSummary:
    exit_code: int  # 2 for lint errors, 1 for findings on changed lines, else 0
    findings: int  # on changed lines
    findings_in_files: int  # anywhere in the changed files
    markdown: str


def lint_section(
    files: list[Path],
    lint_args: str,
    changed: dict[Path, set[int]] | None = None,
    links: LineLinks | None = None,
) -> LintSummary:
    """Run `autoaccel lint --format github` on `files`; annotate (print to the log) the
    findings on `changed` lines (all findings when `changed` is None) and sum them up in
    Markdown, each linked to its line."""
    from autoaccel.lint.output import DOCS_URL
    from autoaccel.rules import all_rules

    run = _autoaccel(
        "lint",
        "--format",
        "github",
        "--force-exclude",
        *shlex.split(lint_args),
        "--",
        *map(str, files),
    )
    _log_untrusted(run.stderr)
    found = parse_annotations(run.stdout)
    new = [f for f in found if changed is None or f.line in changed.get(Path(f.file), {f.line})]
    sys.stdout.writelines(finding.annotation + "\n" for finding in new)
    plural = "s" * (len(new) != 1)
    where = "on the lines this change touches" if changed is not None else "in the linted files"
    with_findings = len({finding.file for finding in new})
    lines = [
        f"**Lint**: {len(new)} finding{plural} {where}, in {with_findings} of {len(files)} "
        f"changed file{'s' * (len(files) != 1)}" + (" (annotations on the diff)." if new else ".")
    ]
    if len(found) > len(new):
        older = len(found) - len(new)
        lines.append(
            f"The changed files have {len(found)} findings in all: {older} on lines this "
            f"change did not touch, neither annotated nor failing the check."
        )
    if run.returncode == 2:
        lines.append(f"\n`autoaccel lint` reported errors:\n\n{code_block(run.stderr.strip())}")
    names = {rule.code: rule.name for rule in all_rules()}
    if new:
        lines += ["", "| Where | Rule | Finding |", "| --- | --- | --- |"]
        for finding in new[:LISTED_FINDINGS]:
            name = names.get(finding.code, "")
            place = inline_code(f"{finding.file}:{finding.line}")
            where = f"[{place}]({links.url(finding)})" if links else place
            message = finding.message.removeprefix(f"{finding.code} ")
            lines.append(
                f"| {table_cell(where)} | [{finding.code}]({DOCS_URL}{finding.code}-{name}.md) "
                f"`{name}` | {table_cell(message)} |"
            )
        if len(new) > LISTED_FINDINGS:
            lines.append(f"\n… and {len(new) - LISTED_FINDINGS} more (annotations on the diff).")
    exit_code = 2 if run.returncode == 2 else 1 if new else 0
    return LintSummary(exit_code, len(new), len(found), "\n".join(lines) + "\n")


def reproduce_section(files: list[Path], lint_args: str) -> str:
    """How to see the same findings locally (all of them, also on untouched lines)."""
    options = shlex.join(["autoaccel", "lint", *shlex.split(lint_args)])
    command = " ".join([options, *(shell_word(str(path)) for path in files)])
    return (
        "To reproduce locally (every finding in the changed files, also on lines this "
        f"change did not touch):\n\n{code_block(command, 'bash')}\n"
    )


def skipped_link_note(path: Path) -> str:
    """Why `path` is neither linted nor previewed."""
    return (
        f"Skipped {inline_code(str(path))}: a symbolic link to a file outside the checkout, "
        "which is not read (it could show the runner's files in this comment).\n"
    )


def skipped_config_note(path: Path, config: Path) -> str:
    """Why `path` is neither linted nor previewed: its settings would be read from `config`."""
    return (
        f"Skipped {inline_code(str(path))}: its settings would come from "
        f"{inline_code(str(config))}, a symbolic link to a file outside the checkout, "
        "which is not read (it could show the runner's files in this comment).\n"
    )


def convert_section(scripts: list[Path], convert_args: str) -> str:
    """`autoaccel convert --format markdown` of each training script (notebooks with
    `--to single`, the only target they support)."""
    if not scripts:
        return ""
    count = f"{len(scripts)} training script{'s' * (len(scripts) != 1)}"
    # a sentence under the heading: each script's report starts with a heading of its own
    parts = [
        "### What `autoaccel convert` would change",
        "",
        f"A preview for the {count} this change touches; nothing is written.",
        "",
    ]
    for script in scripts:
        extra = ["--to", "single"] if script.suffix == ".ipynb" else []
        run = _autoaccel(
            # --no-run: a preview never runs the code of a pull request
            "convert",
            "--format",
            "markdown",
            "--no-run",
            *shlex.split(convert_args),
            *extra,
            "--",
            str(script),
        )
        if run.returncode == 0:
            parts.append(run.stdout)
        else:
            command = inline_code(f"autoaccel convert {shell_word(str(script))}")
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
    base = base_revision(env, inputs.base)
    files = changed_files(repo, base, SOURCE_SUFFIXES)
    outside = links_out_of(repo, files)
    files = [path for path in files if path not in outside]
    configured_outside = configs_out_of(repo, files)
    files = [path for path in files if path not in configured_outside]
    body = [
        COMMENT_MARKER,
        "## autoaccel",
        "",
        *map(skipped_link_note, outside),
        *(skipped_config_note(path, config) for path, config in configured_outside.items()),
    ]
    lint, scripts = LintSummary(0, 0, 0, ""), []
    if files:
        changed = changed_lines(repo, base) if base is not None else None
        lint = lint_section(files, inputs.lint_args, changed, LineLinks.from_env(env, repo))
        scripts = [path for path in files if is_training_script(path)]
        body += [
            lint.markdown,
            convert_section(scripts, inputs.convert_args),
            reproduce_section(files, inputs.lint_args),
        ]
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
            "findings-in-changed-files": str(lint.findings_in_files),
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
