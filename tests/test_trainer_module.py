"""A Trainer in its own file: `trainer.py` gets its model, device and loaders from the
script that imports it (fixtures/projects/trainer_module). Lint reads `trainer.py` as a
module of that script's program, whether it is named alone or found in a folder, and
`convert --to ddp` puts the accumulation micro-steps of its `fit()` loop under
`no_sync()`, although the backward pass is in a method `fit()` calls.

Also fixtures/projects/step_module: a step function in a module that never says `torch`
(converting it again added a copy's `non_blocking=True`: "a step is not idempotent").
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from running import FIXTURES_DIR, run_autoaccel

PROJECT = FIXTURES_DIR / "projects" / "trainer_module"
STEP_MODULE = FIXTURES_DIR / "projects" / "step_module"
TRAINER = (PROJECT / "trainer.py").read_text()


def line_of(text: str, snippet: str) -> int:
    """The 1-based line of the only occurrence of `snippet` in `text`."""
    assert text.count(snippet) == 1, snippet
    return text[: text.index(snippet)].count("\n") + 1


# The four slow patterns of `Trainer.fit()` / `Trainer.validate()`, where lint reports them.
EXPECTED = {
    ("trainer.py", line_of(TRAINER, "x = x.to(self.device)\n"), "ACC103"),
    ("trainer.py", line_of(TRAINER, "y = y.to(self.device)\n"), "ACC103"),
    ("trainer.py", line_of(TRAINER, "total += loss.item()"), "ACC204"),
    ("trainer.py", line_of(TRAINER, "torch.cuda.empty_cache()\n"), "ACC205"),
    ("trainer.py", line_of(TRAINER, "for x, y in self.val_loader:"), "ACC504"),
}


def findings(cli, *paths: str) -> set[tuple[str, int, str]]:
    run = cli("lint", "--format", "json", "--exit-zero", *paths)
    return {
        (Path(d["filename"]).name, d["location"]["row"], d["code"]) for d in json.loads(run.stdout)
    }


@pytest.fixture
def project(tmp_path) -> Path:
    shutil.copytree(PROJECT, tmp_path, dirs_exist_ok=True)
    return tmp_path


def test_trainer_linted_alone_reports_the_slow_patterns(cli, project):
    assert EXPECTED <= findings(cli, "trainer.py")


def test_trainer_in_a_linted_folder_reports_the_slow_patterns(cli, project):
    assert EXPECTED <= findings(cli, ".")


def test_the_script_reports_only_its_own_lines(cli, project):
    """`lint train.py` names one file: trainer.py's findings are reported when it is linted."""
    assert {name for name, _, _ in findings(cli, "train.py")} == {"train.py"}


def without_empty_cache(text: str) -> str:
    return text.replace("                torch.cuda.empty_cache()\n", "")


@pytest.mark.parametrize(
    "device, reported",
    [
        pytest.param('"cuda" if torch.cuda.is_available() else "cpu"', True, id="cuda"),
        pytest.param('"cpu"', False, id="cpu"),
    ],
)
def test_the_device_comes_from_the_calling_script(cli, project, device, reported):
    """Without `torch.cuda.empty_cache()`, trainer.py names no device at all: the copies
    and the `.item()` wait for a GPU only when train.py moves the model to one."""
    trainer = project / "trainer.py"
    trainer.write_text(without_empty_cache(TRAINER))
    train = project / "train.py"
    train.write_text(
        train.read_text().replace('"cuda" if torch.cuda.is_available() else "cpu"', device)
    )
    codes = {code for _, _, code in findings(cli, "trainer.py")}
    assert ({"ACC103", "ACC204"} <= codes) is reported
    assert not ({"ACC103", "ACC204"} & codes) or reported


def test_without_the_script_the_trainer_is_library_code(cli, project):
    """No script imports trainer.py: its caller is unknown, nothing is on a GPU."""
    (project / "train.py").unlink()
    (project / "trainer.py").write_text(without_empty_cache(TRAINER))
    codes = {code for _, _, code in findings(cli, "trainer.py")}
    assert not {"ACC103", "ACC204"} & codes


def convert(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return run_autoaccel("convert", *args, cwd=cwd)


def test_ddp_puts_the_accumulation_micro_steps_under_no_sync(project):
    proc = convert("train.py", "--to", "ddp", "-o", "out", "--no-verify", cwd=project)
    assert proc.returncode == 0, proc.stderr
    converted = (project / "out" / "trainer.py").read_text()
    assert (
        "                with self.ddp_model.no_sync() if no_sync else contextlib.nullcontext():\n"
        "                    loss = self.training_step(x, y)\n"
        "                if sync_gradients:\n"
    ) in converted
    step = line_of(TRAINER, "loss = self.training_step(x, y)")
    assert (
        f"line {step}: ACC404 accumulation micro-steps run under `self.ddp_model.no_sync()`"
        in proc.stdout
    )


def test_lint_of_the_converted_project_reports_what_remains(cli, project):
    """The conversion leaves `.item()` and `empty_cache()` every step: lint still says so."""
    assert (
        convert("train.py", "--to", "ddp", "-o", "out", "--no-verify", cwd=project).returncode == 0
    )
    run = cli("lint", "--format", "json", "--exit-zero", "out")
    codes = {(Path(d["filename"]).name, d["code"]) for d in json.loads(run.stdout)}
    assert {("trainer.py", "ACC204"), ("trainer.py", "ACC205")} <= codes
    assert cli("lint", "out").exit_code == 1


# A step method reached through another attribute (`self.helper`): the conversion
# cannot tell which DDP wrapper it runs.
HELPER_STEP = """\
            for step, (x, y) in enumerate(self.train_loader):
                x = x.to(self.device)
                y = y.to(self.device)
                loss = self.helper.training_step(x, y)
"""


def test_accumulation_that_cannot_go_under_no_sync_is_listed(cli, project):
    """No `no_sync()` is written: the report says so at the loop's line (never silently),
    and lint of the result reports the accumulation (ACC404) at the step method's call."""
    trainer = TRAINER.replace(
        "            for step, (x, y) in enumerate(self.train_loader):\n"
        "                x = x.to(self.device)\n"
        "                y = y.to(self.device)\n"
        "                loss = self.training_step(x, y)\n",
        HELPER_STEP,
    ).replace(
        "        self.accum = accum\n", "        self.accum = accum\n        self.helper = self\n"
    )
    assert trainer != TRAINER
    (project / "trainer.py").write_text(trainer)
    proc = convert(
        "train.py", "--to", "ddp", "-o", "out", "--allow-partial", "--no-verify", cwd=project
    )
    assert proc.returncode == 0, proc.stderr
    assert "no_sync()" not in (project / "out" / "trainer.py").read_text()
    loop = line_of(trainer, "for step, (x, y) in enumerate(self.train_loader):")
    assert f"line {loop}: no_sync not applied: gradient accumulation" in proc.stdout
    converted = (project / "out" / "trainer.py").read_text()
    step = line_of(converted, "loss = self.helper.training_step(x, y)")
    assert ("trainer.py", step, "ACC404") in findings(cli, "out")


def test_step_module_without_torch_converts_stably(tmp_path):
    """steps.py never says `torch`: the first pass skipped its lint fixes, the stability
    pass (its text now mentions torchrun) added `non_blocking=True`."""
    shutil.copytree(STEP_MODULE, tmp_path, dirs_exist_ok=True)
    proc = convert("train.py", "--to", "ddp", "--write", cwd=tmp_path)
    assert "internal error" not in proc.stderr
    # No optimizer: no trained model to wrap in DDP, so the conversion refuses.
    assert proc.returncode != 0 and "nothing written" in proc.stderr
    assert (tmp_path / "steps.py").read_text() == (STEP_MODULE / "steps.py").read_text()
    proc = convert(
        "train.py", "--to", "ddp", "--allow-partial", "-o", "out", "--no-verify", cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr
    converted = (tmp_path / "out" / "steps.py").read_text()
    assert "model(x.cuda(non_blocking=True))" in converted
    again = convert(
        "train.py",
        "--to",
        "ddp",
        "--allow-partial",
        "-o",
        "again",
        "--no-verify",
        cwd=tmp_path / "out",
    )
    assert again.returncode == 0, again.stderr
    assert (tmp_path / "out" / "again" / "steps.py").read_text() == converted


def test_lint_reads_a_module_that_never_says_torch(cli, tmp_path):
    shutil.copytree(STEP_MODULE, tmp_path, dirs_exist_ok=True)
    assert findings(cli, "steps.py") == {("steps.py", 6, "ACC103")}
