"""Proof by running: Horovod, apex.parallel and `torch.distributed.launch` fixtures, converted
with `--to ddp`, train under torchrun.

The originals need Horovod or apex, which are not installed, so only the conversions run
(one epoch each): under `torchrun --standalone --nproc_per_node=2` (gloo, CPU) through the
probe of tests/test_convert_ddp_runs.py, and with plain `python`. Both ranks must finish,
read disjoint halves of every `DistributedSampler` pass, end with equal parameters, and
only rank 0 may save. The converted scripts are snapshots too
(tests/snapshots/legacy_distributed/; `AUTOACCEL_UPDATE_SNAPSHOTS=1` rewrites them).
"""

from __future__ import annotations

import os
from concurrent.futures import Future
from pathlib import Path

import pytest

from running import SessionRuns, runs_fixture, selected
from test_convert_ddp_runs import run_torchrun

pytest.importorskip("torch")
pytestmark = pytest.mark.runs

FIXTURES = ["horovod_mnist.py", "apex_parallel.py", "launch_local_rank.py"]
OPTIONS = ("--to", "ddp", "--amp", "off")
ARGS = ("--epochs", "1")
SNAPSHOTS_DIR = Path(__file__).resolve().parent / "snapshots" / "legacy_distributed"
UPDATE = os.environ.get("AUTOACCEL_UPDATE_SNAPSHOTS") == "1"
PARAMETER_TOLERANCE = 1e-6  # relative: both ranks apply the same averaged gradients


def _job(shared: SessionRuns, name: str) -> dict:
    converted = shared.convert(f"legacy_distributed/{name}", *OPTIONS)
    return {
        "converted": converted,
        "ranks": run_torchrun(converted, ARGS, shared.folder(f"legacy-{name.removesuffix('.py')}")),
        "python": shared.run(converted, ARGS),
    }


def start_runs(shared: SessionRuns, tests: list) -> dict[str, Future]:
    """Each selected fixture converted once and run once each way, in the background (see
    running.py)."""
    return {name: shared.start(_job, name) for name in selected(tests)}


runs = runs_fixture(start_runs)


@pytest.mark.parametrize("name", FIXTURES)
def test_conversion_matches_snapshot(name, runs):
    actual = runs[name].result()["converted"].read_text(encoding="utf-8")
    snapshot = SNAPSHOTS_DIR / f"{name.removesuffix('.py')}.ddp.py"
    if UPDATE:
        snapshot.parent.mkdir(exist_ok=True)
        snapshot.write_text(actual, encoding="utf-8", newline="")
        return
    assert (
        snapshot.is_file()
    ), f"no snapshot {snapshot.name}; create it with AUTOACCEL_UPDATE_SNAPSHOTS=1"
    assert actual == snapshot.read_text(
        encoding="utf-8"
    ), f"{name} differs from {snapshot.name}; if intended, regenerate and review the diff"


@pytest.mark.parametrize("name", FIXTURES)
def test_two_processes_read_disjoint_halves(name, runs):
    ranks = runs[name].result()["ranks"]
    assert [r["exit"] for r in ranks] == ["ok", "ok"]
    assert ranks[0]["losses"] and len(ranks[0]["losses"]) == len(ranks[1]["losses"])
    assert len(ranks[0]["passes"]) == len(ranks[1]["passes"]) >= 1
    for first, second in zip(ranks[0]["passes"], ranks[1]["passes"]):
        assert not set(first["indices"]) & set(second["indices"])
        assert set(first["indices"]) | set(second["indices"]) == set(range(first["size"]))


@pytest.mark.parametrize("name", FIXTURES)
def test_two_processes_end_with_equal_parameters(name, runs):
    first, second = (r["param_digest"] for r in runs[name].result()["ranks"])
    assert first, "no optimizer's parameters recorded"
    assert second == [pytest.approx(d, rel=PARAMETER_TOLERANCE) for d in first]


@pytest.mark.parametrize("name", FIXTURES)
def test_only_rank_zero_saves(name, runs):
    ranks = runs[name].result()["ranks"]
    assert ranks[0]["saves"], "rank 0 saved nothing"
    assert ranks[1]["saves"] == []


@pytest.mark.parametrize("name", FIXTURES)
def test_plain_python_still_trains_one_process(name, runs):
    assert runs[name].result()["python"].losses
