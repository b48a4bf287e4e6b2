"""fixtures/ddp/pinned_eval_loader/: a solver class evaluates, under `torch.no_grad()`,
the loader it trains on, which data.py builds without `pin_memory` (stargan's shape,
bench30 section A). ACC102 pins the loader in data.py; the evaluation copy in train.py
gets `non_blocking=True` in the same conversion. Before, ACC103 counted a loader as
pinned for an evaluation loop only once `pin_memory` was written, so only the second
conversion added it and every target stopped with "a step is not idempotent"."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from autoaccel.convert.log import ConvertOptions
from autoaccel.convert.project_conversion import convert_project, find_project
from autoaccel.fileio import read_source
from running import FIXTURES_DIR

SCRIPT = FIXTURES_DIR / "ddp" / "pinned_eval_loader" / "train.py"
SNAPSHOTS = Path(__file__).resolve().parent / "snapshots" / "pinned_eval_loader"
UPDATE = os.environ.get("AUTOACCEL_UPDATE_SNAPSHOTS") == "1"
EVALUATION_COPY = "                x = x.to(self.device, non_blocking=True)\n"


def converted(options: ConvertOptions) -> dict[str, str]:
    """File name -> its conversion (`convert_project` raises when a second conversion
    would change a file)."""
    project = find_project(SCRIPT, read_source(SCRIPT))
    assert project is not None
    result = convert_project(project, options, "train.py")
    return {file.file.path.name: file.conversion.converted for file in result.files}


@pytest.mark.parametrize(
    "options",
    [ConvertOptions(), ConvertOptions(target="ddp", amp="off"), ConvertOptions(target="fsdp")],
    ids=["single", "ddp", "fsdp"],
)
def test_the_evaluation_copy_of_the_pinned_loader_is_asynchronous_in_one_pass(options):
    files = converted(options)
    assert "pin_memory=torch.cuda.is_available()" in files["data.py"]
    assert files["train.py"].count(EVALUATION_COPY) == 1


def test_ddp_conversion_matches_snapshot():
    for name, text in converted(ConvertOptions(target="ddp", amp="off")).items():
        snapshot = SNAPSHOTS / name.replace(".py", ".ddp.py")
        if UPDATE:
            snapshot.parent.mkdir(exist_ok=True)
            snapshot.write_text(text, encoding="utf-8")
        assert text == snapshot.read_text(
            encoding="utf-8"
        ), "regenerate with AUTOACCEL_UPDATE_SNAPSHOTS=1"
