"""Every command in README.md and docs/*.md that a reader would type runs as written.

A command is a line of a ```bash block (a trailing `\\` joins the next line; `&&` chains are
split). Those that start with `autoaccel`, `.venv/bin/autoaccel`, `python -I -m
autoaccel.ci.github` or `.venv/bin/python benchmarks/` run here, each in a fresh temporary
folder that looks like the checkout (fixtures/, benchmarks/precision/, pyproject.toml, a link to
.venv, and `train.py`, a copy of fixtures/cnn_toplevel.py, for the README's quick start), so
nothing in the checkout changes. The exit code is the one the line's comment states (`# exit 1:
findings`), else 0. Any other command must be in SKIPPED, with the reason it does not run here.
A command that fails is a bug of the doc (or of autoaccel).
"""

from __future__ import annotations

import hashlib
import os
import re
import shlex
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
QUICK_START_SCRIPT = ROOT / "fixtures" / "cnn_toplevel.py"  # `train.py` of the README

# Commands of the docs that do not run here, and why. Keep it short: every other command runs.
SKIPPED = {
    "python3 -m venv .venv": "makes the environment these tests run in (`.ci/run` runs it)",
    ".venv/bin/pip install -e '.[dev]'": "installs from the network (`.ci/run` runs it)",
    ".venv/bin/python -m pytest -q -n 2 --dist loadfile": "the whole suite, minutes (`.ci/run` runs it)",
    '.venv/bin/python -m pytest -q -n 2 --dist loadfile -m "not runs"': "the unit tests: part of the whole suite",
    "torchrun --standalone --nproc_per_node=gpu train.py": (
        "needs GPUs; tests/test_convert_ddp_runs.py runs converted fixtures under torchrun"
        " on 2 CPU processes"
    ),
}
# Commands whose line cannot carry a `# exit N` comment (the README's set-up line is
# checked verbatim by tests/test_readme.py); the README says so in its prose.
EXIT_CODES = {".venv/bin/autoaccel lint fixtures/": 1}  # "prints findings and exits 1"

AUTOACCEL = {"autoaccel", ".venv/bin/autoaccel"}
WRITES = {"--write", "--fix", "-o", "--output", "--report"}
SLOW_SUBCOMMANDS = {"bench", "tune"}  # they run the script


@dataclass(frozen=True)
class Command:
    doc: Path
    line: int  # 1-based, in `doc`
    text: str  # as typed, without the comment
    comment: str
    next_block: str | None  # the ```text block right after this command's block, if any

    @property
    def words(self) -> list[str]:
        return shlex.split(self.text)

    @property
    def program(self) -> list[str]:
        """The words after leading `NAME=value` assignments."""
        words = self.words
        while words and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", words[0]):
            words = words[1:]
        return words

    @property
    def id(self) -> str:
        return f"{self.doc.relative_to(ROOT)}:{self.line}"

    @property
    def runs_here(self) -> bool:
        words = self.program
        if not words:
            return False
        if words[0] in AUTOACCEL:
            return True
        if words[:4] == ["python", "-I", "-m", "autoaccel.ci.github"]:
            return True
        return (
            words[0] == ".venv/bin/python"
            and words[1:2] != []
            and words[1].startswith("benchmarks/")
        )

    @property
    def expected_exit(self) -> int:
        if self.text in EXIT_CODES:
            return EXIT_CODES[self.text]
        found = re.search(r"\bexits? (\d+)\b", self.comment)
        return int(found.group(1)) if found else 0

    @property
    def slow(self) -> bool:
        words = self.program
        return (
            "--verify" in words
            or "autoaccel.ci.github" in words
            or bool(SLOW_SUBCOMMANDS & set(words[1:2]))
            or ("--to" in words and words[words.index("--to") + 1] in {"ddp", "fsdp"})
        )


def _split_comment(line: str) -> tuple[str, str]:
    """`line` cut at its first `#` that starts a shell comment (outside quotes)."""
    quote = None
    for index, char in enumerate(line):
        if quote:
            quote = None if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == "#" and (index == 0 or line[index - 1].isspace()):
            return line[:index].rstrip(), line[index + 1 :].strip()
    return line.rstrip(), ""


def doc_commands(doc: Path) -> list[Command]:
    lines = doc.read_text(encoding="utf-8").split("\n")
    commands: list[Command] = []
    index = 0
    while index < len(lines):
        if lines[index].strip() != "```bash":
            index += 1
            continue
        start = index + 1
        end = next(i for i in range(start, len(lines)) if lines[i].strip() == "```")
        after = end + 1
        while after < len(lines) and not lines[after].strip():
            after += 1
        next_block = None
        if after < len(lines) and lines[after].strip() == "```text":
            close = next(i for i in range(after + 1, len(lines)) if lines[i].strip() == "```")
            next_block = "\n".join(lines[after + 1 : close]) + "\n"
        row = start
        while row < end:
            first, text = row, lines[row]
            while text.endswith("\\") and row + 1 < end:
                row += 1
                text = text[:-1] + " " + lines[row].strip()
            row += 1
            command, comment = _split_comment(text.strip())
            for part in re.split(r"\s&&\s", command) if command else []:
                commands.append(Command(doc, first + 1, part.strip(), comment, next_block))
        index = end + 1
    return commands


ALL = [command for doc in DOCS for command in doc_commands(doc)]
RUN = [command for command in ALL if command.runs_here]


def _workspace(tmp_path: Path) -> Path:
    work = tmp_path / "checkout"
    work.mkdir()
    cache = shutil.ignore_patterns("__pycache__")
    shutil.copytree(ROOT / "fixtures", work / "fixtures", ignore=cache)
    shutil.copytree(
        ROOT / "benchmarks" / "precision", work / "benchmarks" / "precision", ignore=cache
    )
    shutil.copy2(ROOT / "pyproject.toml", work / "pyproject.toml")
    shutil.copy2(QUICK_START_SCRIPT, work / "train.py")
    (work / ".venv").symlink_to(ROOT / ".venv")
    return work


def _git_workspace(work: Path) -> None:
    """A repository whose branch `change` changes `train.py` since `main`, as the
    GitHub Action's local run expects (the change committed on its branch)."""

    def git(*args: str) -> None:
        subprocess.run(
            ["git", "-c", "user.name=t", "-c", "user.email=t@example.com", *args],
            cwd=work,
            check=True,
            capture_output=True,
        )

    git("init", "-q", "-b", "main")
    shutil.copy2(ROOT / "fixtures" / "linear_exact.py", work / "train.py")
    git("add", "train.py")
    git("commit", "-q", "-m", "base")
    git("checkout", "-q", "-b", "change")
    shutil.copy2(QUICK_START_SCRIPT, work / "train.py")
    git("commit", "-q", "-am", "change")


def _snapshot(work: Path) -> dict[str, str]:
    files = {}
    for path in work.rglob("*"):
        relative = path.relative_to(work)
        if relative.parts[0] in {".venv", ".git"} or not path.is_file():
            continue
        files[relative.as_posix()] = hashlib.sha256(path.read_bytes()).hexdigest()
    return files


def _params():
    for command in RUN:
        marks = [pytest.mark.runs] if command.slow else []
        yield pytest.param(command, id=f"{command.id} {command.text}", marks=marks)


@pytest.mark.parametrize("command", list(_params()))
def test_documented_command_runs(command: Command, tmp_path: Path):
    work = _workspace(tmp_path)
    github = "autoaccel.ci.github" in command.words
    if github:
        _git_workspace(work)
    before = _snapshot(work)
    env = {
        **os.environ,
        "PATH": f"{ROOT / '.venv' / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}",
        "NO_COLOR": "1",
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    for name in (
        "FORCE_COLOR",
        "AUTOACCEL_FORCE_AUTOCAST",
        "RUNNER_TEMP",
        "GITHUB_OUTPUT",
        "GITHUB_STEP_SUMMARY",
        "GITHUB_EVENT_PATH",
        "GITHUB_BASE_REF",
    ):
        env.pop(name, None)
    result = subprocess.run(
        ["bash", "-c", command.text],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        timeout=600,
    )
    where = f"{command.id}: `{command.text}`"
    output = f"stdout:\n{result.stdout[-3000:]}\nstderr:\n{result.stderr[-3000:]}"
    exited = f"{where} exited {result.returncode}\n{output}"
    assert result.returncode == command.expected_exit, exited
    assert "Traceback" not in result.stderr and "internal error" not in result.stderr, output

    after = _snapshot(work)
    words = command.program
    if words[0] in AUTOACCEL and words[1] in {"lint", "convert", "config", "rules"}:
        if WRITES & set(words):
            assert after != before, f"{where} documents a write, and nothing changed"
        else:
            assert after == before, f"{where} is a preview, and it changed files"
    if github:
        comment = (work / "autoaccel-comment.md").read_text(encoding="utf-8")
        assert comment.startswith("<!-- autoaccel -->\n## autoaccel"), comment[:200]
        assert "::error title=autoaccel (ACC102),file=train.py," in result.stdout
    if words[:2] == [".venv/bin/python", "benchmarks/precision/precision.py"]:
        assert command.next_block is not None
        assert result.stdout == command.next_block, "the doc's precision table is stale"


def test_every_command_runs_or_is_skipped_with_a_reason():
    unknown = [f"{c.id}: {c.text}" for c in ALL if not c.runs_here and c.text not in SKIPPED]
    assert not unknown, "run these in test_documented_command_runs or add them to SKIPPED"
    texts = {command.text for command in ALL}
    stale = [text for text in SKIPPED if text not in texts]
    assert not stale, f"no doc has these commands any more: {stale}"
    assert all(text in texts for text in EXIT_CODES)


def test_the_quick_start_commands_are_found():
    """The README's quick start, in order: lint, preview, write, ddp with --verify."""
    readme = [c.text for c in ALL if c.doc.name == "README.md" and c.runs_here]
    expected = [
        "autoaccel lint train.py",
        "autoaccel convert train.py",
        "autoaccel convert train.py --write",
        "autoaccel convert train.py --to ddp --verify",
    ]
    positions = [readme.index(text) for text in expected]
    assert positions == sorted(positions), readme
    assert len(RUN) >= 20, [c.text for c in RUN]


def test_comments_are_cut_outside_quotes_only():
    assert _split_comment("autoaccel lint '#x.py'  # exit 1: findings") == (
        "autoaccel lint '#x.py'",
        "exit 1: findings",
    )
    assert _split_comment("a=b#c d") == ("a=b#c d", "")
