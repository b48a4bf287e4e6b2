"""fixtures/ddp/linear_probe: an encoder trained over a DataLoader, and every epoch a
linear probe (probe.py's `fit_head`, SimCLR's shape) built and fitted with L-BFGS on
features encoded under `no_grad()`. The probe's loop fits a model of its own on data no
DataLoader hands out: every process fits one alike, as it evaluates alike, so it needs
no DDP and no share of the data. Before, its loop was taken for training and `--to ddp`
refused ("this forward pass cannot be routed to a DDP wrapper of `head`")."""

from __future__ import annotations

import shutil

import libcst as cst
import pytest
from command_runs import autoaccel
from running import FIXTURES_DIR, _check

from autoaccel.analysis.program import Program
from autoaccel.analysis.project import load_project
from autoaccel.analysis.training import LoopRole, find_training
from autoaccel.convert import project_conversion
from autoaccel.convert.log import ConvertOptions
from autoaccel.fileio import read_source

PROJECT = FIXTURES_DIR / "ddp" / "linear_probe"


def _converted(target: str):
    script = PROJECT / "train.py"
    found = project_conversion.find_project(script, read_source(script))
    assert found is not None
    return project_conversion.convert_project(
        found, ConvertOptions(target=target, amp="off"), "train.py"
    )


@pytest.mark.parametrize("target", ["ddp", "fsdp", "dp"])
def test_the_encoder_is_converted_and_the_probe_left_as_it_is(target):
    result = _converted(target)
    files = {f.file.path.name: f.conversion for f in result.files}
    assert "probe.py" not in files  # nothing to change there
    assert not [s for s in files["train.py"].log.skipped if s.wrong]
    converted = files["train.py"].converted
    wrapper = {
        "ddp": "DDP(\n        encoder",
        "fsdp": "shard_model(encoder)",
        "dp": "nn.DataParallel",
    }
    assert wrapper[target] in converted


def test_the_probe_s_loop_fits_and_the_encoder_s_trains():
    script = PROJECT / "train.py"
    loaded = load_project(script, cst.parse_module(script.read_text()))
    training = find_training(Program.of(loaded.all_modules, loaded.resolve))
    roles = {(loop.module.name, loop.role) for loop in training.step_loops.values()}
    assert roles == {
        ("__main__", LoopRole.TRAIN),
        ("probe", LoopRole.FIT),  # fit_head's
        ("probe", LoopRole.EVAL),  # encode's, under no_grad()
    }


@pytest.mark.runs
def test_the_ddp_conversion_is_proven_with_the_probe_left_out(tmp_path):
    shutil.copytree(PROJECT, tmp_path / "project")
    proc = autoaccel(
        "convert", "project/train.py", "--to", "ddp", "--amp", "off", "-o", "out", cwd=tmp_path
    )
    _check(proc, "convert linear_probe --to ddp")
    output = proc.stdout + proc.stderr
    assert "--verify FAIL" not in output
    assert "the same; 1 fitted anew on each process left out" in output
