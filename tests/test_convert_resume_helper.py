"""fixtures/fsdp/resume_helper: `--resume` loads a checkpoint through `load_checkpoint(path,
net, optimizer)` of the project's utils.py (CIFAR-ZOO's shape). Under `--to fsdp` the model
is sharded, so utils.py's loads go through `load_full_state_dict` and
`load_full_optimizer_state_dict`; before, utils.py was left as it was, the proof (which
never resumes) passed, and `--resume` crashed on the written project."""

from __future__ import annotations

import shutil

import pytest
from running import FIXTURES_DIR, _check, run_ranks

from autoaccel.convert import project_conversion
from autoaccel.convert.log import ConvertOptions
from autoaccel.fileio import read_source

PROJECT = FIXTURES_DIR / "fsdp" / "resume_helper"


def _converted(target: str) -> dict[str, str]:
    script = PROJECT / "train.py"
    found = project_conversion.find_project(script, read_source(script))
    assert found is not None
    result = project_conversion.convert_project(
        found, ConvertOptions(target=target, amp="off"), "train.py"
    )
    return {f.file.path.name: f.conversion.converted for f in result.files}


def test_fsdp_loads_whole_state_dicts_in_the_helper_module():
    utils = _converted("fsdp")["utils.py"]
    assert '    load_full_state_dict(model, checkpoint["state_dict"], strict=False)\n' in utils
    assert (
        '        load_full_optimizer_state_dict(model, optimizer, checkpoint["optimizer"])\n'
        in utils
    )


def test_ddp_leaves_the_helper_s_loads_as_they_are():
    """DDP's model holds whole parameters: a plain load is right."""
    utils = _converted("ddp").get("utils.py", (PROJECT / "utils.py").read_text())
    assert '    model.load_state_dict(checkpoint["state_dict"], strict=False)\n' in utils


@pytest.mark.runs
def test_the_fsdp_project_trains_then_resumes_on_two_processes(cli, tmp_path):
    shutil.copytree(PROJECT, tmp_path / "project")
    run = cli("convert", "project/train.py", "--to", "fsdp", "--amp", "off", "-o", "out")
    assert run.exit_code == 0, run.stderr
    out = tmp_path / "out"
    _check(run_ranks(out / "train.py", (), out), "the converted project")
    resumed = run_ranks(out / "train.py", ("--resume", "--epochs", "3"), out)
    _check(resumed, "the converted project, resumed")
    assert "epoch 2 loss" in resumed.stdout and "epoch 0 loss" not in resumed.stdout
