"""A Trainer class hierarchy in a package of the project (fixtures/projects/trainer_package):
the script imports `PretrainTrainer` through `pkg/training/__init__.py`, which re-exports
it; the subclass (`pkg/training/pretraining.py`) takes its base from that package too, runs
the loop and calls `self(x)` (its own `__call__`) and `self.backward_pass(loss)`, a method
of the base class in `pkg/training/base.py` that calls `.backward()`. The loop is found,
and `--to ddp` names the loop where the model it cannot wrap is used."""

from __future__ import annotations

import shutil
from pathlib import Path

import libcst as cst
import pytest

from autoaccel.analysis.program import Program
from autoaccel.analysis.project import load_project
from autoaccel.analysis.training import LoopRole, find_training
from running import FIXTURES_DIR

PROJECT = FIXTURES_DIR / "projects" / "trainer_package"
SCRIPT = PROJECT / "pretrain.py"
LOOP = "for (x,) in loader:"


def line_of(path: Path, snippet: str) -> int:
    text = path.read_text()
    assert text.count(snippet) == 1, snippet
    return text[: text.index(snippet)].count("\n") + 1


@pytest.fixture(scope="module")
def program() -> Program:
    loaded = load_project(SCRIPT, cst.parse_module(SCRIPT.read_text()))
    return Program.of(loaded.all_modules, loaded.resolve)


def test_the_subclass_links_to_its_base_through_the_package(program):
    bases = {info.name: [b.name for b in info.bases] for info in program.classes.values()}
    assert bases == {"BaseTrainer": [], "PretrainTrainer": ["BaseTrainer"]}


def test_the_loop_of_the_subclass_steps_through_the_base_class_helper(program):
    training = find_training(program)
    steps = [s for s in training.step_loops.values() if s.role is LoopRole.TRAIN]
    assert len(steps) == 1
    step = steps[0]
    assert step.module.name == "pkg.training.pretraining"
    assert step.function.name == "train_epoch"
    assert [(f.module.name, f.name) for f in step.step_functions] == [
        ("pkg.training.base", "backward_pass")
    ]
    assert step.loaders  # the script's DataLoader, through `super().__init__(**kwargs)`
    reached = {(f.module.name, f.name) for f in step.reached}
    assert ("pkg.training.pretraining", "__call__") in reached  # `self(noisy)`


def test_the_model_given_by_keyword_reaches_the_trainer(program):
    training = find_training(program)
    calls = [
        c
        for c in program.calls
        if program.module_of[c].name == "pkg.training.pretraining"
        and program.module_of[c].tree.code_for_node(c) == "self.model(x)"
    ]
    (call,) = calls
    held = program.values_of(call.func, program.module_of[call])
    assert held and all(training.trained & {obj} for obj in held)


def test_ddp_no_run_names_the_loop_whose_model_it_cannot_wrap(cli, tmp_path):
    shutil.copytree(PROJECT, tmp_path, dirs_exist_ok=True)
    run = cli("convert", "--to", "ddp", "--no-run", "pretrain.py")
    assert run.exit_code != 0
    loop = line_of(PROJECT / "pkg" / "training" / "pretraining.py", LOOP)
    assert (
        f"pkg/training/pretraining.py:{loop}:1: error: DistributedDataParallel not applied:"
        " no trained model was recognised in this training loop"
    ) in run.stderr
    assert "no training loop" not in run.stderr
    assert (tmp_path / "pretrain.py").read_text() == SCRIPT.read_text()  # nothing written
