"""`autoaccel bench`: every fixture against its conversion on CPU (a few steps each), the
report files, the exit code on divergence, and the arithmetic behind the numbers."""

from __future__ import annotations

import json
import sys
from functools import partial

import pytest

from autoaccel.bench.compare import (
    EXACT,
    default_tolerance,
    max_relative_difference,
    summarise,
    throughput,
)
from autoaccel.bench.report import PLOT_HINT, write_report
from autoaccel.bench.runner import merge_ranks
from autoaccel.convert.log import ConvertOptions
from command_runs import autoaccel, runs_on_fixtures
from running import FIXTURES_DIR, fixture_names

FIXTURES = fixture_names()
# Written for PyTorch 0.3: the original crashes at its first step, so there is nothing to
# compare with (its conversion is what makes it run; see test_convert_runs.py).
BROKEN_ORIGINAL = "legacy_pytorch03.py"
FEW_STEPS = ("--steps", "6", "--warmup", "2")


bench = partial(autoaccel, "bench")
fixture_runs = runs_on_fixtures(
    "test_conversion_trains_like_the_original", "bench", "--amp", "off", "--json", *FEW_STEPS
)


@pytest.mark.runs
@pytest.mark.parametrize("name", FIXTURES)
def test_conversion_trains_like_the_original(name, fixture_runs):
    proc = fixture_runs[name].result()
    if name == BROKEN_ORIGINAL:
        assert proc.returncode == 2
        assert "the original script failed (error: IndexError" in proc.stderr
        return
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout)
    assert result["agree"] is True
    assert result["compared_steps"] == 6
    assert result["max_rel_diff"] <= EXACT
    for run in result["runs"].values():
        assert run["exit"] == "max-steps"
        assert run["steps_per_s"] > 0
        assert run["peak_rss_bytes"] > 0


@pytest.mark.runs
def test_report_with_bf16(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("matplotlib")
    report = tmp_path / "report"
    proc = bench(FIXTURES_DIR / "resnet_cifar.py", *FEW_STEPS, "--report", str(report), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "loss curves agree" in proc.stdout
    result = json.loads((report / "bench.json").read_text())
    assert result["options"]["amp"] == "bf16" and result["tolerance"] == 0.15
    assert 0 < result["max_rel_diff"] <= 0.15  # bf16 rounds, so not exactly equal
    assert result["runs"]["original"]["samples_per_s"] > 0
    assert (report / "bench.png").read_bytes().startswith(b"\x89PNG")
    assert 'src="data:image/png;base64,' in (report / "index.html").read_text()


@pytest.mark.runs
def test_divergence_exits_1(tmp_path):
    pytest.importorskip("torch")
    proc = bench(
        FIXTURES_DIR / "linear_exact.py", "--amp", "bf16", "--tolerance", "1e-9", *FEW_STEPS,
        cwd=tmp_path,
    )
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "loss curves DIVERGE" in proc.stdout


@pytest.mark.runs
def test_ddp_conversion_runs_one_process_per_rank(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("autoaccel.convert.transforms.distributed")  # `--to ddp`
    proc = bench(
        FIXTURES_DIR / "linear_exact.py", "--to", "ddp", "--nproc", "2", "--amp", "off", "--json",
        *FEW_STEPS, cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout)
    # Unshuffled and sharded evenly: the mean of the ranks' losses is the original's loss.
    assert result["max_rel_diff"] <= EXACT
    assert result["runs"]["converted"]["steps"] == 6


# -- the numbers -------------------------------------------------------------------------
def record(losses, times, samples, exit="max-steps", end_time=None):
    return {
        "losses": losses, "times": times, "samples": samples, "exit": exit,
        "end_time": end_time, "peak_rss_bytes": 2**30, "peak_cuda_bytes": None,
        "device": "cpu", "device_name": "x86_64", "torch_version": "2.13.0",
    }


def test_throughput_leaves_out_the_warmup():
    # Backward calls at these times; steps 0-1 are warm-up. Stopped by the harness, the run
    # is timed from the backward before the first measured step to its synchronised end.
    stopped = record([1.0] * 5, [0.0, 1.0, 1.5, 2.0, 2.5], [8, 16, 24, 32, 40], end_time=2.5)
    speed = throughput(stopped, warmup=2)
    assert (speed.steps, speed.seconds, speed.samples) == (3, 1.5, 24)
    assert speed.steps_per_s == 2.0 and speed.samples_per_s == 16.0
    finished = dict(stopped, exit="ok", end_time=9.0)  # ran to its end: up to the last step
    assert throughput(finished, warmup=2).seconds == 1.5
    assert throughput(record([1.0], [0.0], [0]), warmup=2) is None
    assert throughput(record([1.0] * 3, [0.0, 1.0, 2.0], [0, 0, 0]), 1).samples_per_s is None


def test_max_relative_difference():
    assert max_relative_difference([2.0, 4.0], [2.0, 4.0, 9.0]) == 0.0
    assert max_relative_difference([2.0, 4.0], [2.2, 4.0]) == pytest.approx(0.1)
    assert max_relative_difference([2.0, 4.0], [2.0, float("nan")]) == float("inf")
    assert max_relative_difference([], [1.0]) == float("inf")
    # A moving average over two steps hides step-to-step noise.
    assert max_relative_difference([1.0, 3.0, 1.0], [3.0, 1.0, 3.0], window=2) == 0.0


def test_default_tolerance_follows_the_options():
    assert default_tolerance(ConvertOptions(amp="off")) == EXACT
    assert default_tolerance(ConvertOptions(amp="off", compile=True)) == 0.01
    assert default_tolerance(ConvertOptions(amp="bf16")) == 0.15
    assert default_tolerance(ConvertOptions(target="ddp", amp="off")) == 0.1
    assert default_tolerance(ConvertOptions(target="ddp", amp="bf16")) == 0.15


def test_ranks_are_merged():
    rank0 = dict(record([1.0, 2.0], [0.0, 1.0], [4, 8]), rank=0)
    rank1 = dict(record([3.0, 4.0, 5.0], [0.0, 1.1, 2.0], [4, 8, 12]), rank=1, peak_rss_bytes=2**31)
    merged = merge_ranks([rank1, rank0])
    assert merged["losses"] == [2.0, 3.0]
    assert merged["samples"] == [8, 16]
    assert merged["times"] == [0.0, 1.0]
    assert merged["peak_rss_bytes"] == 2**31


def summary() -> dict:
    original = record([2.0, 1.5, 1.2], [0.0, 1.0, 2.0], [4, 8, 12], end_time=3.0)
    converted = record([2.0, 1.5, 1.25], [0.0, 0.5, 1.0], [4, 8, 12], end_time=1.5)
    result = summarise(original, converted, ConvertOptions(), warmup=1, tolerance=0.05)
    return {"script": "train.py", "command": "--to single --amp bf16 --steps 3", **result}


def test_summary_numbers():
    result = summary()
    assert result["speedup"] == 2.0
    assert result["max_rel_diff"] == pytest.approx(0.05 / 1.2)
    assert result["agree"] is True


def test_report_without_matplotlib_says_how_to_get_the_picture(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` fails
    assert write_report(summary(), tmp_path) == [PLOT_HINT]
    assert json.loads((tmp_path / "bench.json").read_text())["speedup"] == 2.0
    assert not (tmp_path / "bench.png").exists()
    page = (tmp_path / "index.html").read_text()
    assert "pip install &#x27;autoaccel[plot]&#x27;" in page and "<table>" in page
