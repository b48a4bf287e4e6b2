"""Nothing of a scanned repository runs, and nothing it contains forges output: the
Action's Python and git calls, its log and its PR comment, the generated launchers
(issue 19). Nothing outside the checkout is read."""

from __future__ import annotations

import ast
import json
import os
import re
import shlex
import shutil
import subprocess
from html import escape
from pathlib import Path

import pytest
import yaml
from conftest import SCRIPT
from markdown_it import MarkdownIt  # a dependency of rich, which typer depends on
from test_github_action import (  # noqa: F401 - repo: a fixture
    ACTION,
    DATA_MODULE,
    TRAIN,
    Action,
    commit,
    git,
    repo,
)
from test_output_formats import HOSTILE_NAMES

from autoaccel.ci.changes import changed_files, changed_lines
from autoaccel.ci.github import LineLinks, convert_section, lint_section, reproduce_section
from autoaccel.convert.launch import companion_files, launch_lines
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


def rendered(markdown: str) -> str:
    """`markdown` as HTML, raw HTML passed through as GitHub's renderer passes it."""
    return MarkdownIt("commonmark").enable("table").render(markdown)


def table_rows(html: str) -> list[int]:
    """How many cells each row of the tables in `html` has."""
    rows = re.findall(r"<tr>(.*?)</tr>", html, re.DOTALL)
    return [len(re.findall(r"<t[hd]>", row)) for row in rows]


def unclosed_fences(markdown: str) -> list[str]:
    """The opening lines of the code blocks that run to the end of `markdown`."""
    lines = markdown.splitlines()
    blocks = [t for t in MarkdownIt("commonmark").parse(markdown) if t.type == "fence"]
    return [
        lines[block.map[0]]
        for block in blocks
        if not re.fullmatch(rf" {{0,3}}{block.markup}`* *", lines[block.map[1] - 1])
        or block.map[1] - block.map[0] < 2
    ]


FENCE_NAME = "a\n```\n# Heading <img src=x onerror=alert(1)>\n```\nb.py"
HTML_NAME = "a`<img src=x onerror=alert(1)>`b.py"


@pytest.mark.parametrize("name", [FENCE_NAME, HTML_NAME], ids=["fence", "html"])
def test_a_file_name_stays_in_its_cell_of_the_findings_table(tmp_path, monkeypatch, name):
    (tmp_path / name).write_text(SCRIPT)
    monkeypatch.chdir(tmp_path)
    links = LineLinks("https://github.com", "o/r", "0" * 40)
    summary = lint_section([Path(name)], "--select ACC101", None, links)
    html = rendered(summary.markdown)
    assert summary.findings == 1
    assert table_rows(html) == [3, 3]  # the header and the finding
    assert "<img" not in html
    assert not re.search("<h[1-6]>", html)
    assert f"<code>{escape(name.replace(chr(10), ' '))}:4</code>" in html


def test_hostile_file_names_render_as_names_in_the_comment(tmp_path):
    """Each name has its row in the table of findings and its word in the command that
    reproduces them; three are training scripts, whose previews name them too (each
    preview is a run of its own, hence not all)."""
    previewed = [FENCE_NAME, HTML_NAME, "-o.py"]
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    git(checkout, "init", "-q")
    base = commit(checkout, {"README.md": "hi\n"}, "base")
    files = {name: TRAIN if name in previewed else DATA_MODULE for name in HOSTILE_NAMES}
    commit(checkout, files, "hostile names")
    (tmp_path / "event.json").write_text(json.dumps({"pull_request": {"base": {"sha": base}}}))
    action = Action(checkout)
    run = action.run(lint_args="--select ACC101,ACC206")  # one finding in each file
    assert run.returncode == 1, run.stderr
    assert action.outputs()["findings"] == str(len(HOSTILE_NAMES))
    comment = Path(action.outputs()["comment-file"]).read_bytes().decode()
    html = rendered(comment)
    assert "<img" not in html
    assert unclosed_fences(comment) == []
    assert table_rows(html) == [3] * (1 + len(HOSTILE_NAMES))
    headings = re.findall(r"<h\d>(.*?)</h\d>", html)
    assert len(headings) == 2 + len(previewed)
    assert all(heading.startswith(("autoaccel", "What ")) for heading in headings)
    assert "failed:" not in comment  # every preview read its script
    *_, reproduce = closed_fence_content(comment)
    words = [word.removeprefix("./") for word in shlex.split(reproduce)]
    assert words[:4] == ["autoaccel", "lint", "--select", "ACC101,ACC206"]
    # A carriage return ends a line in Markdown as a newline does.
    assert sorted(words[4:]) == sorted(name.replace("\r", "\n") for name in HOSTILE_NAMES)
    assert not (checkout / "pwned").exists()
    assert git(checkout, "status", "--porcelain") == ""


def test_a_link_out_of_the_checkout_is_skipped_with_a_note(repo, tmp_path):  # noqa: F811
    secret = tmp_path / "runner-secrets.py"
    secret.write_text('API_KEY = "SECRET-TOKEN-1234"\n' + TRAIN)
    (repo / "leak.py").symlink_to(secret)
    (repo / "alias.py").symlink_to("train.py")  # inside the checkout: followed
    commit(repo, {}, "links")
    action = Action(repo)
    run = action.run()
    assert run.returncode == 1, run.stderr
    comment = action.summary.read_text()
    assert "SECRET-TOKEN" not in run.stdout + run.stderr + comment
    assert (
        "Skipped `leak.py`: a symbolic link to a file outside the checkout, which is not read"
        in comment
    )
    assert "### autoaccel convert: `alias.py`" in comment
    assert "leak.py" not in run.stdout
    assert json.loads(action.outputs()["training-scripts"]) == [
        "alias.py",
        "notebooks/explore.ipynb",
        "train.py",
    ]


def test_git_runs_no_diff_command_the_repository_configures(repo):  # noqa: F811
    textconv, external = repo.parent / "textconv-ran", repo.parent / "external-diff-ran"
    git(repo, "config", "diff.spy.textconv", f"touch {textconv}; cat")
    git(repo, "config", "diff.external", f"touch {external}; true")
    (repo / ".git" / "info" / "attributes").write_text("*.py diff=spy\n")
    git(repo, "diff", "HEAD~1", "HEAD")  # git itself runs both
    git(repo, "diff", "--no-ext-diff", "HEAD~1", "HEAD")
    assert textconv.exists() and external.exists()
    textconv.unlink(), external.unlink()
    assert Path("train.py") in changed_files(repo, "HEAD~1", (".py",))
    assert changed_lines(repo, "HEAD~1")[Path("train.py")] == set(range(1, 13))
    assert Action(repo).run().returncode == 1
    assert not textconv.exists() and not external.exists()


@pytest.mark.parametrize("name", ["-o.py", "--write.py"])
def test_a_script_named_like_an_option_is_previewed(tmp_path, monkeypatch, name):
    (tmp_path / name).write_text(TRAIN)
    monkeypatch.chdir(tmp_path)
    section = convert_section([Path(name)], "")
    assert f"### autoaccel convert: `{name}`" in section
    assert "failed" not in section
    assert sorted(os.listdir(tmp_path)) == [name]  # nothing written


def test_the_reproduce_command_lints_the_files_it_names(cli, tmp_path):
    names = ["-o.py", FENCE_NAME, "$(touch pwned).py"]
    for name in names:
        (tmp_path / name).write_text(SCRIPT)
    section = reproduce_section([Path(name) for name in names], "--select ACC101")
    (command,) = closed_fence_content(section)
    program, *arguments = shlex.split(command)
    assert program == "autoaccel"
    run = cli(*arguments)
    assert run.exit_code == 1, run.stderr
    assert "Found 3 errors." in run.stderr
    assert not (tmp_path / "pwned").exists()


# A stand-in for each program a launch command starts: it prints the first word that is
# not an option, which a real torchrun, python, sbatch or srun would run.
PROGRAMS = """
script() {
    for word in "$@"; do case $word in -*) ;; *) printf '%s\\n' "$word"; return;; esac; done
}
python() { script "$@"; }; torchrun() { script "$@"; }; sbatch() { script "$@"; }
srun() { shift; script "$@"; }; scontrol() { :; }; export -f script srun scontrol
"""


@pytest.mark.parametrize("launcher", ["torchrun", "slurm", "spawn"])
def test_launch_commands_start_a_script_named_like_an_option(tmp_path, launcher):
    name = "-x.py"
    files = {name: "", **companion_files(name, launcher)}
    for file, text in files.items():
        (tmp_path / file).write_text(text)
    commands = [line for line in launch_lines(name, launcher) if not line.startswith("#")]
    commands += [f"bash {shlex.quote('./' + file)}" for file in files if file.endswith(".sbatch")]
    run = subprocess.run(
        ["bash", "-c", PROGRAMS + "\n".join(commands)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
    )
    started = run.stdout.splitlines()
    assert len(started) == len(commands)
    assert all((tmp_path / path).is_file() for path in started), started


def test_convert_writes_launchers_that_start_a_script_named_like_an_option(cli, tmp_path):
    (tmp_path / "-x.py").write_text(TRAIN)
    run = cli(
        "convert", "--to", "ddp", "--launcher", "slurm", "--write", "--no-verify", "--", "-x.py"
    )
    assert run.exit_code == 0, run.stderr
    assert "  sbatch ./-x.sbatch\n  # one process, as before:\n  python ./-x.py\n" in run.stdout
    assert '    ./-x.py "$@"\n' in (tmp_path / "-x.sbatch").read_text()


def test_the_install_step_reads_the_version_input_as_a_requirement(tmp_path):
    (step,) = [step for step in ACTION["runs"]["steps"] if step.get("name") == "Install autoaccel"]
    fake = tmp_path / "python"
    fake.write_text('#!/bin/sh\nprintf "%s\\n" "$@"\n')
    fake.chmod(0o755)
    requirement = "--index-url=https://example.invalid/simple"
    env = {
        **os.environ,
        "PATH": f"{tmp_path}{os.pathsep}{os.environ['PATH']}",
        "AUTOACCEL_REQUIREMENT": requirement,
    }
    run = subprocess.run(
        ["bash", "-c", step["run"]], env=env, capture_output=True, text=True, check=True
    )
    words = run.stdout.splitlines()
    assert words[words.index("--") + 1 :] == [requirement]


def test_a_line_of_the_diff_cannot_forge_a_hunk_header(repo):  # noqa: F811
    commit(repo, {"train.py": TRAIN + "x = 1  # \f@@ -1 +50,3 @@\n"}, "a form feed")
    assert changed_lines(repo, "HEAD~1") == {Path("train.py"): {13}}
