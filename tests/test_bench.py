"""`autoaccel bench`: every fixture against its conversion on CPU (a few steps, one run
each), the report files, the exit code on divergence, and, on fake runs that need no
torch, the alternation, the speed verdict and its exit code, and the arithmetic."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from functools import partial

import pytest

from autoaccel.bench import command
from autoaccel.bench.compare import (
    EXACT,
    FASTER,
    NOT_JUDGED,
    SAME,
    SLOWER,
    SpeedUp,
    default_tolerance,
    max_relative_difference,
    summarise,
    throughput,
)
from autoaccel.bench.report import (
    PLOT_HINT,
    figure,
    loss_verdict,
    rows,
    speed_verdict,
    throughput_title,
    write_report,
)
from autoaccel.convert.log import ConvertOptions
from autoaccel.run import runner
from autoaccel.run.runner import Run, merge_ranks
from command_runs import autoaccel, runs_on_fixtures
from running import FIXTURES_DIR, fixture_names, runs_fixture

FIXTURES = fixture_names()
# Written for PyTorch 0.3: the original crashes at its first step, so there is nothing to
# compare with (its conversion is what makes it run; see test_convert_runs.py).
BROKEN_ORIGINAL = "legacy_pytorch03.py"
# One run per side: these runs check that the curves agree; the speed verdict, which needs
# three or more, is tested on fake runs below (a real run costs seconds on a shared box).
FEW_STEPS = ("--steps", "6", "--warmup", "2", "--repeats", "1")


bench = partial(autoaccel, "bench")
# `bench` on the fixtures whose runs its accounting meets differently: the broken original
# (exit 2), a plain DataLoader loop, several backward calls per batch (gan), no DataLoader
# (lstm_lm), gradient accumulation (transformer_accum), a weighted sampler and
# nn.DataParallel (imbalanced_resume); resnet_cifar runs through `bench --report` below.
# That every fixture's default conversion trains like its original, on every step of the
# first epoch (where these 8 steps lie), is test_convert_runs.py's proof; benching the
# others again (~6 CPU-s each) would prove it twice.
BENCHED = [
    BROKEN_ORIGINAL,
    "gan.py",
    "imbalanced_resume.py",
    "linear_exact.py",
    "lstm_lm.py",
    "transformer_accum.py",
]
# The default conversion (`--amp bf16`): on a CPU its autocast is disabled, so it must agree
# exactly (EXACT) with the original.
start_runs = runs_on_fixtures(
    "test_conversion_trains_like_the_original", "bench", "--json", *FEW_STEPS
)


fixture_runs = runs_fixture(start_runs)


def test_benched_fixtures_exist():
    assert set(BENCHED) <= set(FIXTURES)


@pytest.mark.runs
@pytest.mark.parametrize("name", BENCHED)
def test_conversion_trains_like_the_original(name, fixture_runs):
    pytest.importorskip("torch")
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
    assert (result["repeats"], result["speed"]) == (1, NOT_JUDGED)
    for run in result["runs"].values():
        assert run["exit"] == "max-steps"
        assert run["steps_per_s"] > 0
        assert run["peak_rss_bytes"] > 0
        assert len(run["per_run"]) == 1


@pytest.mark.runs
def test_report_with_bf16(tmp_path, monkeypatch):
    pytest.importorskip("torch")
    monkeypatch.setenv("AUTOACCEL_FORCE_AUTOCAST", "1")  # bf16 as on a GPU, through bench
    pytest.importorskip("matplotlib")
    report = tmp_path / "report"
    proc = bench(
        FIXTURES_DIR / "resnet_cifar.py", *FEW_STEPS, "--report", str(report), cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "loss curves agree" in proc.stdout
    result = json.loads((report / "bench.json").read_text())
    assert result["options"]["amp"] == "bf16" and result["tolerance"] == 0.15
    assert 0 < result["max_rel_diff"] <= 0.15  # bf16 rounds, so not exactly equal
    assert result["runs"]["original"]["samples_per_s"] > 0
    assert (report / "bench.png").read_bytes().startswith(b"\x89PNG")
    assert 'src="data:image/png;base64,' in (report / "index.html").read_text()


@pytest.mark.runs
def test_divergence_exits_1(tmp_path, monkeypatch):
    pytest.importorskip("torch")
    monkeypatch.setenv("AUTOACCEL_FORCE_AUTOCAST", "1")  # bf16 rounds; float32 would agree
    proc = bench(
        FIXTURES_DIR / "linear_exact.py",
        "--amp",
        "bf16",
        "--tolerance",
        "1e-9",
        *FEW_STEPS,
        cwd=tmp_path,
    )
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "loss curves DIVERGE" in proc.stdout


@pytest.mark.runs
def test_ddp_conversion_runs_one_process_per_rank_with_the_same_threads(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("autoaccel.convert.transforms.distributed")  # `--to ddp`
    # Without OMP_NUM_THREADS, torchrun would give each rank 1 thread and the original all.
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "autoaccel",
            "bench",
            str(FIXTURES_DIR / "linear_exact.py"),
            "--to",
            "ddp",
            "--nproc",
            "2",
            "--amp",
            "off",
            "--json",
            "--verify",
            *FEW_STEPS,
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout)
    # `--verify`: the seven checks of convert's proof on the first runs, all passed
    assert len(result["verify"]) == 7 and all(check["passed"] for check in result["verify"])
    # Unshuffled and sharded evenly: the mean of the ranks' losses is the original's loss.
    assert result["max_rel_diff"] <= EXACT
    assert result["runs"]["converted"]["steps"] == 6
    # The ranks train on disjoint halves of each batch of 32: the job's samples per step
    # are the original's.
    assert samples_per_step(result["runs"]["converted"]) == pytest.approx(32)
    threads = {run["threads"] for side in result["runs"].values() for run in side["per_run"]}
    assert threads == {max(1, (os.cpu_count() or 1) // 2)}
    assert result["threads"] == str(threads.pop())


def test_verify_is_for_ddp(tmp_path):
    proc = bench(FIXTURES_DIR / "linear_exact.py", "--verify", cwd=tmp_path)
    assert (
        proc.returncode == 2 and "--verify checks --to ddp and --to fsdp conversions" in proc.stderr
    )


def samples_per_step(side: dict) -> float:
    return side["samples_per_s"] / side["steps_per_s"]


@pytest.mark.runs
def test_ranks_training_on_the_same_samples_count_them_once(tmp_path):
    """The original script under torchrun: each rank loads all the data, in the same order."""
    pytest.importorskip("torch")
    run = runner.run_script(
        FIXTURES_DIR / "linear_exact.py",
        [],
        4,
        tmp_path / "records",
        nproc=2,
        env={"OMP_NUM_THREADS": "1"},
    )
    assert not run.failed, run.log[-3000:]
    assert run.record["samples"] == [32, 64, 96, 128]


# -- the numbers -------------------------------------------------------------------------
def record(losses, times, samples, exit="max-steps", end_time=None):
    return {
        "losses": losses,
        "times": times,
        "samples": samples,
        "exit": exit,
        "end_time": end_time,
        "peak_rss_bytes": 2**30,
        "peak_cuda_bytes": None,
        "device": "cpu",
        "device_name": "x86_64",
        "torch_version": "2.13.0",
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
    assert merged["samples"] == [8, 16]  # no sample indices recorded: every batch counts
    assert merged["times"] == [0.0, 1.0]
    assert merged["peak_rss_bytes"] == 2**31


@pytest.mark.parametrize(
    ("ids1", "samples"),
    [
        ([[1, [4, 5]], [1, [6, 7]]], [4, 8]),  # disjoint shards: all count
        ([[1, [0, 1]], [1, [2, 3]]], [2, 4]),  # the same samples as rank 0: once
        ([[1, [2, 3]], [1, [0, 1]]], [4, 4]),  # another order, same pass: once overall
        ([[2, [0, 1]], [2, [2, 3]]], [4, 8]),  # the same indices in another pass: all count
    ],
)
def test_samples_two_ranks_train_on_in_one_pass_count_once(ids1, samples):
    rank0 = dict(
        record([1.0, 1.0], [0.0, 1.0], [2, 4]), rank=0, sample_ids=[[1, [0, 1]], [1, [2, 3]]]
    )
    rank1 = dict(record([1.0, 1.0], [0.0, 1.0], [2, 4]), rank=1, sample_ids=ids1)
    assert merge_ranks([rank0, rank1])["samples"] == samples


@pytest.mark.parametrize(
    ("ratios", "noise", "verdict"),
    [
        ((1.49, 0.88, 0.90), 0.0, SAME),  # the three identical runs
        ((1.2, 1.1, 1.3), 0.0, FASTER),
        ((0.9, 0.8, 0.95), 0.0, SLOWER),
        ((0.9, 0.8), 0.0, NOT_JUDGED),  # two pairs are too few
        ((1.0002, 1.04, 1.09), 0.0, SAME),  # 1.0002x is no speed-up: 2 % at least
        ((0.99, 0.97, 0.95), 0.0, SAME),
        ((1.03, 1.04, 1.05), 0.0, FASTER),
        ((1.03, 1.04, 1.05), 0.054, SAME),  # within the original's run-to-run spread
        ((1.06, 1.07, 1.08), 0.054, FASTER),
    ],
)
def test_speed_verdict_needs_every_pair_beyond_the_margin(ratios, noise, verdict):
    assert SpeedUp(ratios, noise).verdict == verdict


def timed(seconds_per_step: float, steps: int = 4, batch: int = 8) -> dict:
    times = [i * seconds_per_step for i in range(steps)]
    samples = [batch * (i + 1) for i in range(steps)]
    return record([2.0 - 0.1 * i for i in range(steps)], times, samples, end_time=times[-1])


def summary(original_seconds=(1.0,), converted_seconds=(0.5,), options=ConvertOptions()) -> dict:
    result = summarise(
        [timed(s, steps=10) for s in original_seconds],
        [timed(s, steps=10) for s in converted_seconds],
        options,
        warmup=1,
        tolerance=0.05,
    )
    return {"script": "train.py", "command": "--to single --amp bf16 --steps 4", **result}


def test_summary_medians_ranges_and_per_run_figures():
    result = summary((1.0, 1.2, 0.8), (0.5, 0.4, 0.5))
    assert result["repeats"] == 3
    assert result["speedup_per_run"] == pytest.approx([2.0, 3.0, 1.6])
    assert result["speedup"] == pytest.approx(2.0)
    assert result["speedup_range"] == pytest.approx([1.6, 3.0])
    assert result["speed"] == FASTER
    original = result["runs"]["original"]
    assert original["samples_per_s"] == pytest.approx(8.0)  # median of 8, 6.67, 10
    assert original["samples_per_s_range"] == pytest.approx([8 / 1.2, 10.0])
    assert [run["seconds"] for run in original["per_run"]] == pytest.approx([9.0, 10.8, 7.2])
    assert result["max_rel_diff"] == 0.0 and result["agree"] is True
    assert rows(result)[1] == ["original", "1.00", "8.00", "6.67 - 10.0", "1,024 MiB RSS", "1.1000"]


def test_speed_verdict_text():
    assert speed_verdict(summary((1.0, 1.0, 1.0), (0.9, 1.1, 1.0))) == (
        "speed-up 1.00x (pairs of runs 0.91x-1.11x): no measurable difference over "
        "3 runs each (not every pair differs by more than 2.0%)"
    )
    assert speed_verdict(summary((1.0,) * 3, (1.2, 1.1, 1.3))).endswith(
        "SLOWER in every pair of runs by more than 2.0% (3 runs each)"
    )
    assert speed_verdict(summary((1.0, 1.1, 0.9), (0.5, 0.5, 0.5))) == (
        "speed-up 2.00x (pairs of runs 1.80x-2.20x): faster in every pair of runs by more "
        "than 20.2%, the spread of the original's runs (3 runs each)"
    )
    assert speed_verdict(summary()) == (
        "speed-up 2.00x: not judged, 1 run each; --repeats 3 or more to judge"
    )


class FakeRuns:
    """Stands in for `runner.run_script`: hands out records timed by `seconds[side]`, one
    per call, and remembers the order of the calls."""

    def __init__(self, original: list[float], converted: list[float], batch: int = 8) -> None:
        self.seconds = {"original": list(original), "converted": list(converted)}
        self.batch = batch
        self.calls: list[str] = []

    def __call__(self, path, args, steps, records, processes, **kwargs) -> Run:
        side = "converted" if path.parent.name == "converted" else "original"
        self.calls.append(side)
        assert kwargs["env"] == {} and callable(kwargs["on_step"])
        return Run(timed(self.seconds[side].pop(0), steps, self.batch), 0, "")


@pytest.mark.parametrize(
    ("converted", "options", "code", "speed"),
    [
        ([0.5, 0.5, 0.5], [], 0, FASTER),
        ([1.1, 0.9, 1.0], [], 0, SAME),
        ([1.2, 1.3, 1.25], [], 1, SLOWER),  # slower beyond the spread fails ...
        ([1.2, 1.3, 1.25], ["--allow-slower"], 0, SLOWER),  # ... unless allowed
    ],
)
def test_runs_alternate_and_a_slower_conversion_exits_1(
    cli, tmp_path, monkeypatch, converted, options, code, speed
):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    fake = FakeRuns([1.0, 1.0, 1.0], converted)
    monkeypatch.setattr(command, "run_script", fake)
    script = tmp_path / "train.py"
    script.write_text((FIXTURES_DIR / "linear_exact.py").read_text())
    run = cli(
        "bench", "train.py", "--steps", "4", "--warmup", "1", "--amp", "off", "--json", *options
    )
    assert run.exit_code == code, run.stderr
    assert fake.calls == ["original", "converted"] * 3
    result = json.loads(run.stdout)
    assert (result["repeats"], result["speed"]) == (3, speed)
    assert len(result["runs"]["converted"]["per_run"]) == 3
    assert "--repeats 3" in result["command"]


def test_slower_conversion_is_said_in_the_text(cli, tmp_path, monkeypatch):
    monkeypatch.setattr(command, "run_script", FakeRuns([1.0] * 3, [2.0] * 3))
    (tmp_path / "train.py").write_text((FIXTURES_DIR / "linear_exact.py").read_text())
    run = cli("bench", "train.py", "--steps", "4", "--warmup", "1", "--amp", "off")
    assert run.exit_code == 1
    # On one line, though not a terminal: piped, rich would break it at 80 columns.
    assert (
        "speed-up 0.50x (pairs of runs 0.50x-0.50x): SLOWER in every pair of runs by more "
        "than 2.0% (3 runs each)\n" in run.stdout
    )
    assert "loss curves agree" in run.stdout


def test_equal_medians_are_no_measurable_difference_everywhere(cli, tmp_path, monkeypatch):
    """A user's report: 0.92 steps/s and 58.9 samples/s on both sides, pairs 1.0002x-1.09x,
    was called "faster in every pair" in the text and "1.04x faster" in the plot."""
    original = [0.92, 0.88, 0.93]  # steps/s of each run
    converted = [rate * ratio for rate, ratio in zip(original, (1.0002, 1.04, 1.09))]
    seconds = partial(map, lambda rate: 1 / rate)
    monkeypatch.setattr(command, "run_script", FakeRuns(seconds(original), seconds(converted), 64))
    (tmp_path / "train.py").write_text((FIXTURES_DIR / "linear_exact.py").read_text())
    run = cli(
        "bench", "train.py", "--steps", "4", "--warmup", "1", "--amp", "off", "--report", "report"
    )
    assert run.exit_code == 0, run.stderr
    result = json.loads((tmp_path / "report" / "bench.json").read_text())
    assert [row[1:3] for row in rows(result)[1:]] == [["0.920", "58.9"], ["0.920", "58.9"]]
    assert result["speedup_range"] == pytest.approx([1.0002, 1.09])
    assert result["speed"] == SAME
    assert "speed-up 1.04x (pairs of runs 1.00x-1.09x): no measurable difference" in run.stdout
    assert "faster" not in run.stdout
    assert throughput_title(result) == "Throughput: no measurable difference"
    if importlib.util.find_spec("matplotlib"):
        assert figure(result).axes[1].get_title() == "Throughput: no measurable difference"


def test_progress_reaches_the_caller_step_by_step(tmp_path, monkeypatch):
    """`run_script` passes on the step count the harness writes (a stand-in here)."""

    def fake_harness(
        record_path, steps, nproc, progress, scratch=None, epoch_cut=None, batch_prints=False
    ):
        code = (
            "import json, pathlib, sys, time\n"
            f"for step in range(1, {steps} + 1):\n"
            f"    pathlib.Path({str(progress)!r}).write_text(str(step)); time.sleep(0.3)\n"
            f"pathlib.Path({str(record_path).replace('{rank}', '0')!r}).write_text(json.dumps("
            "{'losses': [], 'times': [], 'samples': [], 'exit': 'ok'}))\n"
            "sys.exit(0)\n"
        )
        return [sys.executable, "-c", code]

    monkeypatch.setattr(runner, "harness_command", fake_harness)
    seen: list[int] = []
    run = runner.run_script(tmp_path / "train.py", [], 3, tmp_path / "records", on_step=seen.append)
    assert run.returncode == 0, run.log
    assert seen == sorted(seen) and seen[-1] == 3 and len(set(seen)) >= 2


def test_plot_marks_the_warmup_and_counts_steps_in_whole_numbers():
    pytest.importorskip("matplotlib")
    result = summary((1.0, 1.2, 0.8), (0.5, 0.4, 0.5))
    curves, bars = figure(result).axes
    assert "warm-up (not timed)" in curves.get_legend_handles_labels()[1]
    ticks = [tick for tick in curves.get_xticks() if 1 <= tick <= 4]
    assert ticks and all(float(tick).is_integer() for tick in ticks)
    assert bars.get_title() == "Throughput: 2.00x faster"
    assert [line.get_label() for line in curves.get_lines()] == ["original", "converted"]


def test_ddp_curves_are_judged_and_drawn_as_moving_averages():
    pytest.importorskip("matplotlib")
    result = summary(options=ConvertOptions(target="ddp", amp="off"))
    assert result["smoothing_window"] == 2  # a fifth of 10 steps
    assert "difference of the 2-step moving averages 0.000%" in loss_verdict(result)
    labels = [line.get_label() for line in figure(result).axes[0].get_lines()]
    assert labels == ["original", "original, 2-step mean", "converted", "converted, 2-step mean"]


def test_report_without_matplotlib_says_how_to_get_the_picture(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` fails
    assert write_report(summary(), tmp_path) == [PLOT_HINT]
    report = json.loads((tmp_path / "bench.json").read_text())
    assert report["speedup"] == 2.0 and report["repeats"] == 1
    assert len(report["runs"]["original"]["per_run"]) == 1
    assert not (tmp_path / "bench.png").exists()
    page = (tmp_path / "index.html").read_text()
    assert "pip install &#x27;autoaccel[plot]&#x27;" in page and "<table>" in page
