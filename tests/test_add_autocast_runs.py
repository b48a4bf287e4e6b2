"""Proof by running for the step shapes whose autocast goes somewhere other than the loop
body: fixtures/amp/micro_batches.py (backward in a loop over chunks of the batch) and
fixtures/amp/step_module (the step is `mylib.train_step()`, autocast goes into mylib.py).

Four runs: each original, and each default conversion with bf16 autocast forced on
(`AUTOACCEL_FORCE_AUTOCAST=1`, as on a GPU; on a CPU the conversion leaves autocast
disabled, so the run that enters the new autocast blocks is the forced one). The forced run
must train close to the original: last-epoch mean loss within the tolerance below.
"""

from __future__ import annotations

import math
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path

import pytest

from running import FIXTURES_DIR, SessionRuns, runs_fixture
from test_convert_runs import FORCED_BF16, rel_gap

pytest.importorskip("torch")
pytestmark = pytest.mark.runs

AMP = FIXTURES_DIR / "amp"
MICRO = AMP / "micro_batches.py"
STEP_MODULE = AMP / "step_module"
# (backward calls per epoch, tolerance on the last epoch's mean loss with bf16 forced on).
# Measured gaps (2 epochs, torch 2.13, 2-core CPU): micro_batches 0.066 %, step_module 0.002 %;
# 0.1 % is the smallest tolerance of tests/test_convert_runs.py.
CASES = {
    "micro_batches": (32, 0.003),  # 8 batches x 4 chunks
    "step_module": (8, 0.001),  # 128 samples in batches of 16
}


def converted_step_module(shared: SessionRuns) -> Path:
    """The step module's project converted (default options) into a folder: train.py and
    mylib.py. Converted in this process: `find_project` converts the modules that hold a
    step loop or its loader, and mylib.py holds only the step function the loop calls, so
    it is added here while the project leaves it out (the xfail test of test_add_autocast.py)."""
    from autoaccel.convert.log import ConvertOptions
    from autoaccel.convert.project_conversion import ProjectFile, convert_project, find_project
    from autoaccel.fileio import read_source

    script, lib = STEP_MODULE / "train.py", STEP_MODULE / "mylib.py"
    project = find_project(script, read_source(script))
    assert project is not None
    if all(f.path.resolve() != lib.resolve() for f in project.files):
        project.files.append(ProjectFile("mylib", lib, "", read_source(lib)))
        project.context = [m for m in project.context if m.name != "mylib"]
    result = convert_project(project, ConvertOptions(), "train.py")
    folder = shared.folder("step_module-default")
    for file in result.files:
        (folder / file.file.path.name).write_text(file.conversion.converted, encoding="utf-8")
    return folder / "train.py"


@dataclass(frozen=True)
class Runs:
    orig: list[float]
    bf16: list[float]
    converted: dict[str, str]  # file name -> converted text


def _job(shared: SessionRuns, name: str) -> Runs:
    if name == "micro_batches":
        original, converted = MICRO, shared.convert(MICRO)
    else:
        original, converted = STEP_MODULE / "train.py", converted_step_module(shared)
    texts = {p.name: p.read_text(encoding="utf-8") for p in converted.parent.glob("*.py")}
    return Runs(shared.run(original).losses, shared.run(converted, (), FORCED_BF16).losses, texts)


def start_runs(shared: SessionRuns, tests: list) -> dict[str, Future]:
    return {name: shared.start(_job, name) for name in CASES}


loss_runs = runs_fixture(start_runs)


@pytest.mark.parametrize("name", sorted(CASES))
def test_forced_bf16_trains_close_to_original(name, loss_runs):
    steps, tolerance = CASES[name]
    runs = loss_runs[name].result()
    orig, bf16 = runs.orig, runs.bf16
    assert len(orig) == len(bf16) == 2 * steps
    assert all(math.isfinite(v) for v in bf16)
    assert bf16 != orig  # the autocast blocks ran in bf16

    def last(losses: list[float]) -> float:
        return sum(losses[-steps:]) / steps

    gap = rel_gap(last(orig), last(bf16))
    assert gap <= tolerance, f"final loss differs by {gap:.3%} (tolerance {tolerance:.1%})"


def test_the_autocast_blocks_are_where_the_forward_passes_run(loss_runs):
    (micro,) = loss_runs["micro_batches"].result().converted.values()
    assert (
        "        for mx, my in zip(x.chunk(4), y.chunk(4)):\n            with torch.autocast(\n"
        in micro
    )
    step = loss_runs["step_module"].result().converted
    assert "torch.autocast" not in step["train.py"]
    assert "    optimizer.zero_grad()\n    with torch.autocast(\n" in step["mylib.py"]


def test_numpy_of_autocast_outputs_runs_with_bf16_on(tmp_path: Path) -> None:
    """With autocast forced on (as on a GPU) by the harness, the converted
    fixtures/amp/numpy_outputs.py runs to its end: its `.numpy()` calls get float32."""
    from autoaccel.convert.log import ConvertOptions
    from autoaccel.convert.pipeline import convert_source
    from running import run_under_harness

    fixture = AMP / "numpy_outputs.py"
    script = tmp_path / fixture.name
    script.write_text(convert_source(fixture.read_text(), ConvertOptions(), fixture.name).converted)
    run = run_under_harness(script, [], tmp_path, env=FORCED_BF16)
    assert run.returncode == 0 and run.record["exit"] == "ok", run.stderr[-2000:]
