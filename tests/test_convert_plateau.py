"""A `ReduceLROnPlateau` steps on a metric averaged over the processes (the tenth unseen
set's pytorch-speech-commands: each process's validation loss differed in the fifth
digit, through its own BatchNorm statistics). fixtures/ddp/plateau_scheduler.py."""

from __future__ import annotations

import pytest
from running import FIXTURES_DIR

from autoaccel.convert.log import ConvertOptions
from autoaccel.convert.pipeline import convert_source

FIXTURE = FIXTURES_DIR / "ddp" / "plateau_scheduler.py"


def convert(source: str, target: str = "ddp"):
    return convert_source(source, ConvertOptions(target=target, amp="off"), FIXTURE.name)


@pytest.mark.parametrize("target", ["ddp", "fsdp"])
def test_the_plateau_metric_is_averaged_over_the_processes(target):
    conversion = convert(FIXTURE.read_text(encoding="utf-8"), target)
    code = conversion.converted
    assert "        scheduler.step(averaged_over_processes(val_loss))\n" in code
    assert "    dist.all_reduce(total)\n" in code
    assert [c.line for c in conversion.log.changes if "plateau" in c.description] == [28]
    assert convert(code, target).converted == code, "a second pass changes nothing"


@pytest.mark.parametrize(
    "before, after",
    [
        (
            "        scheduler.step(val_loss)\n",
            "        if RANK == 0:\n            scheduler.step(val_loss)\n",
        ),
        (
            "torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, patience=0)",
            "torch.optim.lr_scheduler.StepLR(optimizer, step_size=1)",
        ),
    ],
    ids=["under-a-rank-test", "another-scheduler"],
)
def test_other_steps_stay(before, after):
    source = FIXTURE.read_text(encoding="utf-8").replace(before, after)
    assert "averaged_over_processes" not in convert(source).converted


def test_one_process_keeps_the_metric():
    assert "averaged_over_processes" not in convert(FIXTURE.read_text(), "single").converted


@pytest.mark.runs
def test_the_conversion_is_proven(proven):
    assert "scheduler.step(averaged_over_processes(val_loss))" in proven(FIXTURE, "ddp")
