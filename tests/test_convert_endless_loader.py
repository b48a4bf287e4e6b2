"""Batches drawn with `next()` from a project generator that reads the loader over and
over (DDPM's `script_utils.cycle`, the tenth unseen set: every pass read each process's
shard in the same order, which the proof refused). fixtures/projects/endless_loader."""

from __future__ import annotations

import shutil

import pytest
from running import FIXTURES_DIR

PROJECT = FIXTURES_DIR / "projects" / "endless_loader"


def convert(cli, tmp_path, *flags: str, utils: tuple[str, str] = ("", "")):
    project = tmp_path / "project"
    shutil.copytree(PROJECT, project)
    helpers = project / "utils.py"
    helpers.write_text(helpers.read_text().replace(*utils))
    run = cli("convert", str(project / "train.py"), "--to", "ddp", *flags, "-o", "out.py")
    return run, tmp_path / "out.py"


def test_the_endless_generator_gives_way_to_one_that_counts_epochs(cli, tmp_path):
    run, out = convert(cli, tmp_path, "--no-run")
    assert run.exit_code == 0, run.stderr
    code = out.read_text()
    assert "    train_loader = endless_epochs(train_loader2)\n" in code
    assert "            loader.sampler.set_epoch(loader.sampler.epoch + 1)\n" in code
    assert "`endless_epochs(...)` in place of `utils.cycle(...)`" in run.stdout


def test_a_generator_that_does_more_is_left_as_it_is(cli, tmp_path):
    """One that also transforms its batches is not the same generator: no epoch is set,
    and the proof would say so."""
    run, out = convert(
        cli, tmp_path, "--no-run", utils=("            yield data", "            yield data * 2")
    )
    assert "def endless_epochs(" not in out.read_text()


@pytest.mark.runs
def test_the_conversion_is_proven(cli, tmp_path):
    run, _ = convert(cli, tmp_path)
    assert run.exit_code == 0, run.stderr
    assert "--verify ok   processes train on different data" in run.stderr
