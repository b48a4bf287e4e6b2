"""A function that makes every split's DataLoader in one loop, and a log file a helper
module opens (cs230-code-examples, the tenth unseen set: refused for a summed loss that
was a mean; with that fixed, the validation loader was sharded too, each process
evaluating its share alone, and both processes wrote train.log).
fixtures/projects/split_loaders."""

from __future__ import annotations

import shutil

import pytest
from running import FIXTURES_DIR

PROJECT = FIXTURES_DIR / "projects" / "split_loaders"


def convert(cli, tmp_path, target: str, *flags: str):
    project = tmp_path / "project"
    shutil.copytree(PROJECT, project)
    out = tmp_path / "out"
    run = cli("convert", str(project / "train.py"), "--to", target, *flags, "-o", str(out))
    return run, out


@pytest.mark.parametrize("target", ["ddp", "fsdp"])
def test_without_a_run_loaders_it_cannot_tell_apart_are_refused(cli, tmp_path, target):
    run, out = convert(cli, tmp_path, target, "--no-run")
    assert run.exit_code == 1 and not out.exists()
    assert (
        "data.py:17:1: error: DistributedSampler not applied: `fetch_dataloader()` makes 2 of"
        " the DataLoaders the training reads" in run.stderr
    )
    assert "a short run of the script can show which loader trains" in run.stderr


@pytest.mark.parametrize("target", ["ddp", "fsdp"])
def test_the_helpers_log_file_is_made_on_rank_zero(cli, tmp_path, target):
    run, out = convert(cli, tmp_path, target, "--no-run", "--allow-partial")
    assert run.exit_code in (0, 1), run.stderr
    utils = (out / "utils.py").read_text()
    made = "logging.FileHandler(path) if RANK == 0 else logging.NullHandler()\n"
    assert f"        file_handler = {made}" in utils


@pytest.mark.runs
def test_a_run_shards_the_training_loader_only(cli, tmp_path):
    """(The loaders are told apart by ShardTrainLoader, the same step for `--to fsdp`,
    whose refusal without a run the test below checks too.)"""
    run, out = convert(cli, tmp_path, "ddp")
    assert run.exit_code == 0, run.stderr
    assert "no backward() followed any of its 16 batches" in run.stdout
    loaders = (out / "data.py").read_text()
    assert loaders.count("DistributedSampler(") == 1
    assert "--verify ok   one process writes each file" in run.stderr


def test_alternatives_that_all_shuffle_are_each_a_training_loader(cli, tmp_path):
    """A factory that makes one shuffled loader per dataset (ACGAN's `dataloader(dataset,
    ...)`, if/elif on its name: the eleventh unseen set) makes alternatives, not a training
    and a validation loader: every one is sharded, without a run."""
    project = tmp_path / "project"
    shutil.copytree(PROJECT, project)
    data = project / "data.py"
    data.write_text(data.read_text().replace("shuffle=False", "shuffle=True"))
    out = tmp_path / "out"
    run = cli("convert", str(project / "train.py"), "--to", "ddp", "--no-run", "-o", str(out))
    assert run.exit_code == 0, run.stderr
    assert (out / "data.py").read_text().count("DistributedSampler(") == 2
