"""Nothing of a scanned repository runs, and nothing it contains forges output: the
Action's Python and git calls, its log and its PR comment, the generated launchers
(issue 19)."""

from __future__ import annotations

import ast
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from test_github_action import TRAIN, Action, commit, git, repo  # noqa: F401 - fixture

from autoaccel.ci.changes import changed_files
from autoaccel.convert.launch import companion_files
from autoaccel.convert.log import ConversionLog
from autoaccel.convert.pipeline import Conversion
from autoaccel.convert.report import markdown_report
from autoaccel.discovery import discover
from autoaccel.markdown import code_block, inline_code

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
ROOT = Path(__file__).resolve().parent.parent
TOUCH = "import pathlib\npathlib.Path(__file__).with_name('RAN-{}').touch()\n"


def test_the_action_imports_nothing_from_the_checkout(repo):  # noqa: F811
    commit(
        repo, {f"{name}.py": TOUCH.format(name) for name in ("json", "typer", "libcst")}, "shadow"
    )
    run = Action(repo).run()
    assert run.returncode == 1, run.stderr  # the lint's findings, as without the modules
    assert "::error title=autoaccel (ACC101),file=train.py," in run.stdout
    assert sorted(p.name for p in repo.glob("RAN-*")) == []


def test_every_python_the_action_starts_is_isolated():
    action = yaml.safe_load((ROOT / "action.yml").read_text())
    commands = [step["run"] for step in action["runs"]["steps"] if "run" in step]
    started = [len(re.findall(r"\bpython\b", command)) for command in commands]
    isolated = [len(re.findall(r"\bpython -I -m ", command)) for command in commands]
    assert started == isolated == [1, 1]


def test_git_ignores_the_commands_a_scanned_repository_configures(repo):  # noqa: F811
    marker = repo.parent / "fsmonitor-ran"
    git(repo, "config", "core.fsmonitor", f"touch {marker}; false")
    git(repo, "status")  # git itself runs the hook
    assert marker.exists()
    marker.unlink()
    assert repo / "train.py" in discover([str(repo)])
    assert Path("train.py") in changed_files(repo, "HEAD~1", (".py",))
    assert Path("train.py") in changed_files(repo, None, (".py",))
    assert not marker.exists()


def test_the_base_input_cannot_pass_git_an_option(repo, tmp_path):  # noqa: F811
    written = tmp_path / "written-by-git"
    run = Action(repo).run(base=f"--output={written}")
    assert run.returncode == 2
    assert (
        f"autoaccel: error: git does not know the base revision '--output={written}'" in run.stderr
    )
    assert not written.exists()


def workflow_commands(log: str) -> list[str]:
    """The lines the runner would take as workflow commands, `::stop-commands::` obeyed."""
    commands, stopped_by = [], None
    for line in log.splitlines():
        line = line.strip()
        if stopped_by is not None:
            stopped_by = None if line == f"::{stopped_by}::" else stopped_by
        elif line.startswith("::stop-commands::"):
            stopped_by = line.removeprefix("::stop-commands::")
        elif line.startswith("::"):
            commands.append(line)
    return commands


def test_lint_errors_about_pr_files_cannot_forge_workflow_commands(repo):  # noqa: F811
    forged = "::error file=README.md,line=1::forged"
    commit(repo, {f"{forged}.py": "import torch\ndef f(:\n"}, "a broken file with a forged name")
    run = Action(repo).run()
    assert run.returncode == 2
    assert f"{forged}.py:2:7: SyntaxError" in run.stderr
    commands = workflow_commands(run.stdout) + workflow_commands(run.stderr)
    assert commands
    assert all(command.startswith("::error title=autoaccel (ACC") for command in commands)


def closed_fence_content(markdown: str) -> list[str]:
    """The contents of the fenced code blocks, closed as CommonMark closes them: at a
    line of at least as many backticks, indented by at most three spaces."""
    blocks, fence, lines = [], None, []
    for line in markdown.splitlines():
        if fence is None:
            opening = re.match(r" {0,3}(`{3,})[^`]*$", line)
            if opening:
                fence, lines = opening.group(1), []
        elif re.fullmatch(rf" {{0,3}}{fence}`* *", line):
            blocks.append("\n".join(lines))
            fence = None
        else:
            lines.append(line)
    return blocks


def test_a_diff_with_backtick_lines_stays_inside_its_code_block():
    original = 'import torch\ndoc = """\n```\n"""\nx = torch.zeros(1)\n'
    converted = original.replace("zeros(1)", "zeros(2)")
    report = markdown_report(Conversion(original, converted, ConversionLog()), "train.py")
    (diff,) = closed_fence_content(report)
    assert " ```" in diff.splitlines()
    assert diff.splitlines()[-1] == "+x = torch.zeros(2)"


@pytest.mark.parametrize("text", ["plain", "```", "a\n````\nb", "`x`"])
def test_code_blocks_and_spans_hold_any_text(text):
    assert closed_fence_content(code_block(text, "diff")) == [text]
    span = inline_code(text)
    fence = re.match("`+", span).group()
    assert "\n" not in span
    assert span[len(fence) : -len(fence)].strip(" ") == text.replace("\n", " ")
    assert fence not in span[len(fence) : -len(fence)]


NAME = "$(touch PWNED).py"


def test_the_sbatch_file_quotes_the_script_name(tmp_path):
    ((name, text),) = companion_files(NAME, "slurm").items()
    (tmp_path / name).write_text(text)
    stand_ins = 'srun() { printf "%s\\n" "$@"; }; scontrol() { :; }; export -f srun scontrol'
    run = subprocess.run(
        ["bash", "-c", f"{stand_ins}; bash ./{shlex.quote(name)}"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
    )
    assert run.stdout.splitlines()[-1] == NAME
    assert not (tmp_path / "PWNED").exists()


@pytest.mark.parametrize("name", [NAME, 'a"""b\\.py', "new\nline.py"])
def test_the_spawn_file_names_the_script_as_a_string(name):
    ((spawn, text),) = companion_files(name, "spawn").items()
    tree = ast.parse(text)
    (script,) = [
        node.value
        for node in tree.body
        if isinstance(node, ast.Assign) and node.targets[0].id == "SCRIPT"
    ]
    assert script.args[1].value == name
    assert ast.get_docstring(tree).startswith("Start ")
