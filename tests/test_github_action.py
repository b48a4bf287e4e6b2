"""The GitHub Action: action.yml's own step script, run the way the runner runs it, in a
temporary git repository with a fake `GITHUB_*` environment."""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import fields
from pathlib import Path

import pytest
import yaml  # a dependency of libcst, so always installed with autoaccel
from conftest import CLEAN

from autoaccel.ci.changes import NO_COMMIT, base_revision, changed_files, changed_lines
from autoaccel.ci.github import COMMENT_MARKER, Inputs
from autoaccel.diff import use_colour

ROOT = Path(__file__).resolve().parent.parent
ACTION = yaml.safe_load((ROOT / "action.yml").read_text())
NOTEBOOK = ROOT / "fixtures" / "notebooks" / "train.ipynb"
# A finding (a CPU tensor moved to the GPU) but no training loop.
# A tensor built on the CPU for every evaluation batch, then moved (ACC206).
DATA_MODULE = (
    "import torch\nfrom torch.utils.data import DataLoader\n\n"
    "for x in DataLoader(ds):\n    print(x - torch.zeros(3).cuda())\n"
)
TRAIN = """\
import torch
from torch.utils.data import DataLoader

loader = DataLoader(dataset, batch_size=32)
model = torch.nn.Linear(4, 2).cuda()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for x, y in loader:
    x, y = x.cuda(), y.cuda()
    loss = torch.nn.functional.cross_entropy(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
"""

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")


def git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args],
        cwd=repo,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()


def commit(repo: Path, files: dict[str, str], message: str) -> str:
    for name, text in files.items():
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_text(text)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "--allow-empty", "-m", message)
    return git(repo, "rev-parse", "HEAD")


@pytest.fixture
def repo(tmp_path):
    """A pull request: the base has an old training script; the change adds a training
    script, a notebook, a module with a finding but no training loop, and a clean file."""
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q")
    base = commit(repo, {"old_train.py": TRAIN, "README.md": "hi\n"}, "base")
    commit(
        repo,
        {
            "train.py": TRAIN,
            "notebooks/explore.ipynb": NOTEBOOK.read_text(),
            "src/data.py": DATA_MODULE,
            "src/clean.py": CLEAN,
            "notes.md": "DataLoader(ds)\n",
        },
        "change",
    )
    (tmp_path / "event.json").write_text(json.dumps({"pull_request": {"base": {"sha": base}}}))
    return repo


class Action:
    """Runs the step of action.yml that does the work, as the runner would."""

    def __init__(self, repo: Path) -> None:
        self.repo = repo
        self.home = repo.parent
        self.summary = self.home / "summary.md"
        self.outputs_file = self.home / "outputs.txt"

    def run(self, **inputs: str) -> subprocess.CompletedProcess[str]:
        (step,) = [step for step in ACTION["runs"]["steps"] if step.get("id") == "autoaccel"]
        values = {name: spec.get("default", "") for name, spec in ACTION["inputs"].items()}
        values.update({name.replace("_", "-"): value for name, value in inputs.items()})
        env = {
            key: re.sub(r"\$\{\{ inputs\.([\w-]+) \}\}", lambda m: values[m.group(1)], value)
            for key, value in step["env"].items()
        }
        env.update(
            PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
            GITHUB_EVENT_NAME="pull_request",
            GITHUB_EVENT_PATH=str(self.home / "event.json"),
            GITHUB_STEP_SUMMARY=str(self.summary),
            GITHUB_OUTPUT=str(self.outputs_file),
            RUNNER_TEMP=str(self.home),
            GITHUB_REPOSITORY="o/r",
            HOME=os.environ.get("HOME", str(self.home)),
        )
        return subprocess.run(
            ["bash", "-c", step["run"]], cwd=self.repo, env=env, capture_output=True, text=True
        )

    def outputs(self) -> dict[str, str]:
        return dict(line.split("=", 1) for line in self.outputs_file.read_text().splitlines())


@pytest.fixture
def action(repo):
    return Action(repo)


def test_pull_request_annotations_summary_comment_and_outputs(action):
    run = action.run()
    assert run.returncode == 1, run.stderr  # findings fail the step by default
    annotations = run.stdout.splitlines()
    assert all(line.startswith("::error title=autoaccel (ACC") for line in annotations)
    files = {re.search(r",file=([^,]+),", line).group(1) for line in annotations}
    assert files == {"train.py", "src/data.py", "notebooks/explore.ipynb"}  # not old_train.py
    assert "::error title=autoaccel (ACC101),file=train.py,line=4,col=10," in run.stdout
    assert "(cell 6:5:10)" in run.stdout  # the notebook finding names its cell

    summary = action.summary.read_text()
    assert summary.startswith(f"{COMMENT_MARKER}\n## autoaccel\n")
    assert (
        f"**Lint**: {len(annotations)} findings on the lines this change touches, in 3 of 4 "
        "changed files (annotations on the diff)." in summary
    )
    head = git(action.repo, "rev-parse", "HEAD")
    assert (
        f"| [`train.py:4`](https://github.com/o/r/blob/{head}/train.py#L4) "
        "| [ACC101](https://github.com/autoaccel/autoaccel/blob/main/rules/" in summary
    )
    # Previews for the changed training scripts only: not the module without a loop.
    assert "### autoaccel convert: `train.py`" in summary
    assert "### autoaccel convert: `notebooks/explore.ipynb`" in summary
    assert "`src/data.py`" not in summary.split("### What")[1]
    assert headings_in_a_row(summary) == []
    assert "+    num_workers=min(8, os.cpu_count() or 1)," in summary
    assert "\033[" not in summary + run.stdout  # no colour codes in CI logs or Markdown

    outputs = action.outputs()
    assert Path(outputs["comment-file"]).read_text() == summary
    assert outputs["changed-files"] == "4"
    assert outputs["findings"] == outputs["findings-in-changed-files"] == str(len(annotations))
    assert json.loads(outputs["training-scripts"]) == ["notebooks/explore.ipynb", "train.py"]
    # Nothing in the repository was written by the previews.
    assert git(action.repo, "status", "--porcelain") == ""


def test_only_findings_on_changed_lines_are_annotated_and_fail(action, repo, tmp_path):
    """A pull request that edits old_train.py (whose DataLoader finding on line 4 was
    already there) and adds a loader on a new last line: only that one counts."""
    base = git(repo, "rev-parse", "HEAD")
    added = "other = DataLoader(dataset)\nfor x, y in other:\n    model(x).sum().backward()\n"
    head = commit(repo, {"old_train.py": TRAIN + added}, "new training loader")
    (tmp_path / "event.json").write_text(json.dumps({"pull_request": {"base": {"sha": base}}}))
    run = action.run(lint_args="--select ACC101")
    assert run.returncode == 1, run.stderr
    assert run.stdout.splitlines() == [
        "::error title=autoaccel (ACC101),file=old_train.py,line=13,col=9,endLine=13,"
        "endColumn=28::ACC101 `DataLoader` loads batches in the main process (`num_workers=0`)"
    ]
    summary = action.summary.read_text()
    assert "**Lint**: 1 finding on the lines this change touches, in 1 of 1 changed file" in summary
    assert "2 findings in all: 1 on lines this change did not touch" in summary
    # Linked to the line at the commit that was linted; the comment ends with the command.
    assert f"[`old_train.py:13`](https://github.com/o/r/blob/{head}/old_train.py#L13)" in summary
    assert summary.endswith("```bash\nautoaccel lint --select ACC101 old_train.py\n```\n")
    outputs = action.outputs()
    assert (outputs["findings"], outputs["findings-in-changed-files"]) == ("1", "2")


def test_findings_only_on_untouched_lines_pass(action, repo, tmp_path):
    base = git(repo, "rev-parse", "HEAD")
    commit(repo, {"old_train.py": TRAIN + "# a comment\n"}, "comment")
    (tmp_path / "event.json").write_text(json.dumps({"pull_request": {"base": {"sha": base}}}))
    run = action.run()
    assert (run.returncode, run.stdout) == (0, ""), run.stderr
    assert "**Lint**: 0 findings on the lines this change touches" in action.summary.read_text()


def test_changed_lines_of_the_diff(repo):
    base = git(repo, "rev-parse", "HEAD")
    edited = TRAIN.replace("lr=0.1", "lr=0.2").replace("    optimizer.step()\n", "")
    commit(repo, {"train.py": "+++ b/not-a-header\n" + edited, "new.py": "a\nb\n"}, "edit")
    git(repo, "rm", "-q", "src/clean.py")
    commit(repo, {}, "delete")
    assert changed_lines(repo, base) == {Path("train.py"): {1, 7}, Path("new.py"): {1, 2}}


def test_inputs_select_rules_keep_the_step_green_and_place_the_comment(action, tmp_path):
    target = tmp_path / "out" / "comment.md"
    target.parent.mkdir()
    run = action.run(
        fail_on_findings="false", lint_args="--select ACC102", comment_file=str(target)
    )
    assert run.returncode == 0, run.stderr
    assert {line.split(")")[0] for line in run.stdout.splitlines()} == {
        "::error title=autoaccel (ACC102"
    }
    assert action.outputs()["comment-file"] == str(target)
    assert target.read_text().startswith(COMMENT_MARKER)


def test_no_changed_python_files(action, repo):
    commit(repo, {"docs.md": "more\n"}, "docs only")
    base = git(repo, "rev-parse", "HEAD~1")
    run = action.run(base=base)
    assert (run.returncode, run.stdout) == (0, "")
    assert "No Python files or notebooks changed." in action.summary.read_text()
    assert action.outputs()["training-scripts"] == "[]"


def test_action_definition_passes_every_input_to_the_entry_point():
    assert ACTION["runs"]["using"] == "composite"
    (step,) = [step for step in ACTION["runs"]["steps"] if step.get("id") == "autoaccel"]
    assert step["run"] == "python -I -m autoaccel.ci.github"
    assert all(s["shell"] == "bash" for s in ACTION["runs"]["steps"] if "run" in s)
    # Inputs reach the script through the environment only (no `${{ }}` in scripts).
    assert not any("${{" in s.get("run", "") for s in ACTION["runs"]["steps"])
    # Every variable the step sets changes an input, and every input has one.
    changed = {
        f.name
        for key in step["env"]
        for f in fields(Inputs)
        if getattr(Inputs.from_env({key: "false"}), f.name) != getattr(Inputs(), f.name)
    }
    assert changed == {f.name for f in fields(Inputs)}
    assert len(step["env"]) == len(fields(Inputs))
    for name in ACTION["outputs"]:
        assert ACTION["outputs"][name]["value"] == f"${{{{ steps.autoaccel.outputs.{name} }}}}"


def test_base_revision_follows_the_event(tmp_path):
    event = tmp_path / "event.json"
    env = {"GITHUB_EVENT_PATH": str(event)}
    event.write_text(json.dumps({"pull_request": {"base": {"sha": "abc"}}, "before": "def"}))
    assert base_revision(env) == "abc"
    assert base_revision(env, explicit="v1.0") == "v1.0"
    event.write_text(json.dumps({"before": "def"}))
    assert base_revision(env) == "def"
    event.write_text(json.dumps({"before": NO_COMMIT}))  # a push that created the branch
    assert base_revision(env) is None
    assert base_revision({"GITHUB_BASE_REF": "main"}) == "origin/main"
    assert base_revision({}) is None


def test_changed_files_without_a_base_are_all_tracked_files(repo):
    suffixes = (".py", ".ipynb")
    assert [p.as_posix() for p in changed_files(repo, None, suffixes)] == [
        "notebooks/explore.ipynb",
        "old_train.py",
        "src/clean.py",
        "src/data.py",
        "train.py",
    ]
    git(repo, "rm", "-q", "src/clean.py")
    commit(repo, {"old_train.py": TRAIN + "# edited\n"}, "edit and delete")
    assert [p.as_posix() for p in changed_files(repo, "HEAD~1", suffixes)] == ["old_train.py"]


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_colour_only_on_a_terminal_without_no_color(monkeypatch):
    monkeypatch.delenv("NO_COLOR", raising=False)
    assert use_colour(_Terminal())
    assert not use_colour(io.StringIO())  # a pipe, a file, a CI log
    monkeypatch.setenv("NO_COLOR", "1")
    assert not use_colour(_Terminal())


def headings_in_a_row(markdown: str) -> list[tuple[str, str]]:
    """Each heading followed by another with only blank lines between (an empty section)."""
    lines = [line for line in markdown.splitlines() if line.strip()]
    return [(a, b) for a, b in zip(lines, lines[1:]) if a.startswith("#") and b.startswith("#")]


def test_convert_section_has_no_empty_heading(tmp_path, monkeypatch):
    from autoaccel.ci.github import convert_section

    (tmp_path / "train.py").write_text(TRAIN)
    monkeypatch.chdir(tmp_path)
    section = convert_section([Path("train.py")], "--amp off")
    assert section.startswith(
        "### What `autoaccel convert` would change\n\nA preview for the 1 training script this"
    )
    assert "### autoaccel convert: `train.py`" in section
    assert headings_in_a_row(section) == []


def test_a_refused_ddp_preview_shows_as_a_failure_with_the_reason(tmp_path, monkeypatch):
    """A conversion that would train wrongly is shown as failed in the comment, with the
    line and the reason, never as a diff to apply."""
    from autoaccel.ci.github import convert_section

    script = tmp_path / "train.py"
    script.write_text(TRAIN.replace("for x, y in loader:", "for step in range(100):"))
    monkeypatch.chdir(tmp_path)
    section = convert_section([Path("train.py")], "--to ddp")
    assert "`autoaccel convert train.py` failed:" in section
    assert "train.py:7:1: error: DistributedSampler not applied" in section
    assert "--to ddp refused" in section


def test_a_pyproject_linked_out_of_the_checkout_is_not_read(action, repo, tmp_path):
    secret = tmp_path / "runner-config.toml"
    secret.write_text(
        '[tool.autoaccel]\nSECRET-TOKEN-1234 = "x"\n'
    )  # an unknown key: an error quoting it
    (repo / "src" / "pyproject.toml").symlink_to(secret)
    commit(repo, {}, "a linked config")
    run = action.run()
    comment = action.summary.read_text()
    assert "SECRET-TOKEN" not in run.stdout + run.stderr + comment
    assert (
        "Skipped `src/data.py`: its settings would come from `src/pyproject.toml`, a symbolic"
        " link to a file outside the checkout" in comment
    )
    assert "### autoaccel convert: `train.py`" in comment  # the other files are linted
    assert run.returncode == 1, run.stderr
