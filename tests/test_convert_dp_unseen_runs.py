"""The fixtures of tests/test_convert_dp_unseen.py, converted with `--to dp`, train like
the originals with every wrapper a `SplitInTwo` (tests/test_convert_dp_runs.py): each
tensor the wrapper gets is split in two along dimension 0 on the CPU, so every loss
equals the original's only where the inputs are batch-first."""

from __future__ import annotations

from pathlib import Path

import pytest

from autoaccel.convert.log import ConvertOptions
from autoaccel.convert.pipeline import convert_source
from autoaccel.convert.project_conversion import convert_project, find_project
from autoaccel.fileio import read_source
from test_convert_dp_runs import SPLIT_REL, assert_trains_like_the_original, split_in_two

pytestmark = pytest.mark.runs

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "dp"
DP = ConvertOptions(target="dp", amp="off")


@pytest.mark.parametrize(
    "name", ["conditional_forward.py", "infinite_loader.py", "annotated_step.py"]
)
def test_unseen_shape_trains_like_the_original(name: str, tmp_path: Path) -> None:
    pytest.importorskip("torch")
    fixture = FIXTURES / name
    code = convert_source(fixture.read_text(encoding="utf-8"), DP, str(fixture)).converted
    assert "LossInForward(" in code
    assert_trains_like_the_original(
        fixture, split_in_two(code, tmp_path / name), tmp_path, SPLIT_REL
    )


def test_distillation_project_trains_like_the_original(tmp_path: Path) -> None:
    """distill_stages/: the converted loops.py (its SplitInTwo replacing DataParallel for
    every module) is imported by train.py, whose epochs run `train_distill`."""
    pytest.importorskip("torch")
    script = FIXTURES / "distill_stages" / "train.py"
    project = find_project(script, read_source(script))
    assert project is not None
    folder = tmp_path / "converted"
    folder.mkdir()
    for file in convert_project(project, DP, "train.py").files:
        path = folder / file.file.path.name
        if "LossInForward(" in file.conversion.converted:
            split_in_two(file.conversion.converted, path)
        else:
            path.write_text(file.conversion.converted, encoding="utf-8")
    assert (folder / "loops.py").read_text(encoding="utf-8").count("SplitInTwo") > 0
    assert_trains_like_the_original(script, folder / "train.py", tmp_path, SPLIT_REL)
