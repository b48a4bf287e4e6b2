"""The proof of `convert --to ddp|fsdp` (`--verify`, on by default when the result is written):
a good conversion passes, broken ones fail with the reason.

The checks are unit-tested on hand-made records; the runs (marked `runs`) convert the
ddp fixtures of `fixtures/ddp/`, each written for one fix the conversion makes (a summed
loss, a stop on the loss, fresh random batches, shapes built from the batch size), run
them on 2 CPU processes (gloo) and break a good conversion on purpose.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from concurrent.futures import Future
from pathlib import Path

import pytest

from autoaccel.convert.log import DIFFERENT_DATA
from autoaccel.convert.verify import Check, checks
from autoaccel.run.runner import Run
from running import (
    DDP_OPTIONS,
    SessionRuns,
    run_autoaccel,
    run_ranks,
    run_script,
    runs_fixture,
    selected,
)

DDP_FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "ddp"


def _ids(rank: int) -> list:
    """Four steps of one pass, two samples a step, each process its own share."""
    return [[1, [8 * step + 2 * rank, 8 * step + 2 * rank + 1]] for step in range(4)]


def _rank(rank: int, **fields) -> dict:
    record = {
        "rank": rank, "exit": "max-steps", "losses": [1.0, 0.8, 0.6, 0.5],
        "sample_ids": _ids(rank), "first_param_digest": [[1.0, 2.0]], "param_digest": [[1.5, 3.0]],
        "saves": [],
    }  # fmt: skip
    return {**record, **fields}


def _run(*ranks: dict) -> Run:
    merged = {
        **ranks[0],
        "losses": [sum(r["losses"][i] for r in ranks) / len(ranks) for i in range(4)],
    }
    return Run(merged, 0, "", list(ranks))


ORIGINAL = Run(
    {
        "losses": [1.0, 0.8, 0.6, 0.5], "exit": "max-steps",
        "first_param_digest": [[1.0, 2.0]], "param_digest": [[1.4, 2.9]],
    },
    0,
    "",
)  # fmt: skip


VALUES = "printed and logged averages and totals as the original's"


def _failed(found: list[Check]) -> dict[str, str]:
    return {check.name: check.detail for check in found if not check.passed}


def test_a_good_distributed_run_passes_every_check():
    found = checks(ORIGINAL, _run(_rank(0, saves=["model.pt"]), _rank(1)))
    assert _failed(found) == {}
    assert [c.name for c in found] == [
        "every process finishes", "processes train on different data",
        "parameters equal on every process", "the optimizers update the model",
        "one process writes each file", VALUES,
        "loss close to the original's",
    ]  # fmt: skip


def test_an_optimizer_that_never_changes_its_parameters_fails():
    """minGPT's optimizer, built by `model.configure_optimizers()` before fully_shard,
    held the unsharded tensors: the model never trained, yet the loss check passed (28%
    off, under its 30% tolerance)."""
    stale = {"first_param_digest": [[1.5, 3.0]]}
    failed = _failed(checks(ORIGINAL, _run(_rank(0, **stale), _rank(1, **stale))))
    assert list(failed) == ["the optimizers update the model"]
    assert "parameter set 1 never changes" in failed["the optimizers update the model"]


def test_an_optimizer_holding_freed_tensors_fails():
    """minGPT's `configure_optimizers()`, registered as an FSDP forward method, gathered
    the parameters and handed AdamW the whole ones, freed after the call: the harness
    leaves them out of the digest (reading them crashed the process) and counts them."""
    failed = _failed(checks(ORIGINAL, _run(_rank(0, freed_parameters=4), _rank(1))))
    assert list(failed) == ["the optimizers update the model"]
    assert "holds 4 tensor(s) whose memory FSDP let go" in failed["the optimizers update the model"]


@pytest.mark.parametrize(
    "rank1, check, reason",
    [
        ({"sample_ids": _ids(0)}, "processes train on different data", "8 of 16 samples"),
        ({"param_digest": [[1.6, 3.0]]}, "parameters equal on every process", "not synchronised"),
        ({"saves": ["model.pt"]}, "one process writes each file", "2 processes wrote model.pt"),
    ],
    ids=["same-samples", "parameters-differ", "two-writers"],
)
def test_a_broken_property_fails_its_check(rank1, check, reason):
    found = checks(ORIGINAL, _run(_rank(0, saves=["model.pt"]), _rank(1, **rank1)))
    failed = _failed(found)
    assert list(failed) == [check] and reason in failed[check]


def test_files_that_differ_in_their_numbers_only_are_one_file():
    """TensorBoard names its event files by process id and time: two processes writing
    `runs/events.<pid>` write one log twice."""
    found = checks(
        ORIGINAL, _run(_rank(0, writes=["runs/events.41"]), _rank(1, writes=["runs/events.42"]))
    )
    assert _failed(found) == {
        "one process writes each file": "2 processes wrote runs/events.41 and runs/events.42"
    }


def _passes(*orders: list[int], size: int = 2) -> list:
    """Steps of `size` samples, pass by pass, in the given orders."""
    return [
        [number, order[i : i + size]]
        for number, order in enumerate(orders, 1)
        for i in range(0, len(order), size)
    ]


def test_a_process_that_reads_the_same_order_every_epoch_fails_where_the_original_reshuffles():
    """A DistributedSampler never told `set_epoch` (the loader made in one module, the
    epochs counted in another): each process repeats its first epoch's order."""
    original = Run(
        {**ORIGINAL.record, "sample_ids": _passes([3, 0, 2, 1], [1, 2, 0, 3], size=4)}, 0, ""
    )
    stale = _run(
        _rank(0, sample_ids=_passes([4, 0], [4, 0])), _rank(1, sample_ids=_passes([1, 5], [1, 5]))
    )
    failed = _failed(checks(original, stale))["processes train on different data"]
    assert failed.startswith("process 0 trains on its samples in the same order in every epoch")
    unshuffled = Run(
        {**ORIGINAL.record, "sample_ids": _passes([0, 1, 2, 3], [0, 1, 2, 3], size=4)}, 0, ""
    )
    assert "processes train on different data" not in _failed(checks(unshuffled, stale))


def test_a_file_two_processes_write_is_named_with_the_line_that_wrote_it():
    sites = {"write_sites": {"out/metrics.json": "utils_io.py:12"}}
    found = checks(
        ORIGINAL,
        _run(_rank(0, writes=["out/metrics.json"], **sites), _rank(1, writes=["out/metrics.json"])),
    )
    assert (
        _failed(found)["one process writes each file"]
        == "2 processes wrote out/metrics.json (written at utils_io.py:12)"
    )


def test_a_model_that_never_changes_fails_where_the_original_records_none():
    same = {"first_param_digest": [[1.5, 3.0]], "param_digest": [[1.5, 3.0]]}
    original = Run({**ORIGINAL.record, "first_param_digest": [], "param_digest": []}, 0, "")
    failed = _failed(checks(original, _run(_rank(0, **same), _rank(1, **same))))
    assert "no parameter changes in 4 steps" in failed["the optimizers update the model"]
    assert _failed(checks(original, _run(_rank(0), _rank(1)))) == {}


def _printing(*lines: str) -> Run:
    return Run({**ORIGINAL.record, "printed": list(lines)}, 0, "")


@pytest.mark.parametrize(
    "printed, passes",
    [
        (["epoch 0: avg loss 0.6", "epoch 1: avg loss 0.3"], False),  # half, in every line
        (["epoch 0: avg loss 0.6", "epoch 1: avg loss 0.55"], True),  # half once: noise
        (["epoch 0: avg loss 1.4", "epoch 1: avg loss 0.5"], True),
        (["epoch 0: accuracy 0.6", "epoch 1: accuracy 0.3"], True),  # not an average or total
    ],
    ids=["halved", "halved-once", "noise", "unlabelled"],
)
def test_a_printed_average_off_by_the_processes_fails(printed, passes):
    original = _printing(
        "epoch 0: avg loss 1.2",
        "epoch 1: avg loss 0.6",
        "epoch 0: accuracy 1.2",
        "epoch 1: accuracy 0.6",
    )
    found = _failed(checks(original, _run(_rank(0, printed=printed), _rank(1))))
    assert (found == {}) is passes, found
    if not passes:
        assert "`epoch #: avg loss #` prints 0.6 where the original prints 1.2" in found[VALUES]


@pytest.mark.parametrize(
    "printed, passes",
    [
        # a sum of rank 0's own losses over the whole set's size: its numbers move with its
        # losses (0.31 and 0.5 times the original's), half the original's per unit of loss
        (["epoch 0: loss 0.125", "epoch 1: loss 0.2"], False),
        (["epoch 0: loss 0.25", "epoch 1: loss 0.4"], True),  # the same per unit of loss
    ],
    ids=["halved-per-unit-of-loss", "right"],
)
def test_a_printed_sum_is_compared_per_unit_of_the_losses_since_its_last_print(printed, passes):
    """Noise of training moves the printed sums of two runs apart; relative to the mean
    loss of the steps each covers, a sum over one process's share is half the original's."""
    original = Run(
        {**ORIGINAL.record, "losses": [1.0, 3.0, 2.0, 2.0], "printed": ["epoch 0: loss 0.4", "epoch 1: loss 0.4"],
         "printed_steps": [2, 4]}, 0, "",
    )  # fmt: skip
    rank0 = _rank(0, losses=[2.0, 0.5, 1.0, 3.0], printed=printed, printed_steps=[2, 4])
    rank1 = _rank(1, losses=[0.0, 5.5, 3.0, 1.0])  # the ranks' mean: the original's losses
    found = _failed(checks(original, _run(rank0, rank1)))
    assert (found == {}) is passes, found
    if not passes:
        assert "0.50 times per unit of loss" in found[VALUES]


def test_a_printed_loss_of_the_last_step_is_no_average():
    """`print(f"epoch {epoch}: loss {loss.item():.4f}")`: the last batch's loss, rank 0's
    twice the original's by chance (a step of its own half of a batch). It was compared as
    a total and refused, "off by the number of processes"; it is the step's loss (to its
    printed digits) in both runs, so it is not compared."""
    original = Run(
        {**ORIGINAL.record, "printed": ["epoch 0: loss 0.6000", "epoch 1: loss 0.5000"],
         "printed_steps": [3, 4]}, 0, "",
    )  # fmt: skip
    rank0 = _rank(
        0, losses=[1.0, 0.8, 1.2, 1.0], printed=["epoch 0: loss 1.2000", "epoch 1: loss 1.0000"],
        printed_steps=[3, 4],
    )  # fmt: skip
    rank1 = _rank(1, losses=[1.0, 0.8, 0.0, 0.0])  # the ranks' mean: the original's losses
    assert _failed(checks(original, _run(rank0, rank1))) == {}
    # numbers no step's loss is in either run: compared, twice the original's in both lines
    averaged = Run(
        {**original.record, "printed": ["epoch 0: loss 0.6500", "epoch 1: loss 0.5500"]}, 0, ""
    )
    doubled = {**rank0, "printed": ["epoch 0: loss 1.3000", "epoch 1: loss 1.1000"]}
    assert VALUES in _failed(checks(averaged, _run(doubled, rank1)))


@pytest.mark.parametrize(
    "logged, passes",
    [
        # melgan: the sum over rank 0's half of the validation set over the whole set's size
        ([["validation.g_loss", 22.2, 0], ["validation.g_loss", 9.3, 4]], False),
        ([["validation.g_loss", 40.1, 0], ["validation.g_loss", 19.0, 4]], True),
        ([["lr", 0.05, 0], ["lr", 0.025, 4]], True),  # no average or total: not compared
    ],
    ids=["halved", "right", "unlabelled"],
)
def test_a_logged_average_off_by_the_processes_fails_with_its_tag(logged, passes):
    """A value the script logs only (TensorBoard, wandb) is compared by its tag, as a
    printed one by its line; the failure names the tag and the user's line that logs it."""
    original = Run(
        {**ORIGINAL.record,
         "logged": [["validation.g_loss", 44.0, 0], ["validation.g_loss", 17.5, 4], ["lr", 0.1, 0],
                    ["lr", 0.05, 4]],
         "log_sites": {"validation.g_loss": "writer.py:17"}}, 0, "",
    )  # fmt: skip
    found = _failed(checks(original, _run(_rank(0, logged=logged), _rank(1))))
    assert (found == {}) is passes, found
    if not passes:
        assert found[VALUES].startswith(
            "tag `validation.g_loss` (writer.py:17) logs 22.2 where the original logs 44"
        )


@pytest.mark.parametrize(
    "logged, passes",
    [
        # rank 0's own losses summed over the whole set's size: half per unit of loss
        ([["epoch/loss_sum", 0.125, 2], ["epoch/loss_sum", 0.2, 4]], False),
        ([["epoch/loss_sum", 0.25, 2], ["epoch/loss_sum", 0.4, 4]], True),
        # a loss logged every step: rank 0's own batch, half the original's once by chance
        ([["train/loss", loss, step + 1] for step, loss in enumerate([1.0, 1.5, 2.0, 1.5])], True),
    ],
    ids=["halved-per-unit-of-loss", "right", "per-step"],
)
def test_a_logged_value_is_compared_per_unit_of_the_losses_since_its_last_log(logged, passes):
    """As a printed sum (see above): the steps done when a value was logged give the
    losses it covers."""
    original = Run(
        {**ORIGINAL.record, "losses": [1.0, 3.0, 2.0, 2.0],
         "logged": [["epoch/loss_sum", 0.4, 2], ["epoch/loss_sum", 0.4, 4],
                    *([["train/loss", loss, step + 1]
                       for step, loss in enumerate([1.0, 3.0, 2.0, 2.0])])]},
        0, "",
    )  # fmt: skip
    rank0 = _rank(0, losses=[1.0, 1.5, 2.0, 1.5], logged=logged)
    rank1 = _rank(1, losses=[1.0, 4.5, 2.0, 2.5])  # the ranks' mean: the original's losses
    found = _failed(checks(original, _run(rank0, rank1)))
    assert (found == {}) is passes, found
    if not passes:
        assert "tag `epoch/loss_sum` logs 0.125" in found[VALUES]
        assert "0.50 times per unit of loss" in found[VALUES]


@pytest.mark.parametrize(
    "label, counts",
    [
        ("validation.g_loss", True),
        ("val/loss", True),
        ("loss_avg", True),
        ("Loss_D", True),
        ("train_total", True),
        ("losses", False),
        ("lossless", False),
        ("summary", False),
        ("meaning", False),
        ("accuracy", False),
    ],
)
def test_a_tag_counts_as_an_average_by_its_words(label, counts):
    """Underscores, dots and slashes part the words of a tag; a longer word is not one."""
    original = Run({**ORIGINAL.record, "logged": [[label, 2.0, 2], [label, 2.0, 4]]}, 0, "")
    rank0 = _rank(0, logged=[[label, 1.0, 2], [label, 1.0, 4]])
    assert (VALUES in _failed(checks(original, _run(rank0, _rank(1))))) is counts


def test_draws_with_replacement_may_meet_on_two_processes():
    """minGPT's `RandomSampler(replacement=True)`: each process draws on its own, so a
    sample may come up on two of them, as it may twice on one."""
    drawn = [[1, [3, 5]], [1, [5, 9]], [1, [1, 2]], [1, [7, 4]]]
    found = checks(ORIGINAL, _run(_rank(0, sample_ids=drawn), _rank(1, sample_ids=drawn[::-1])))
    assert _failed(found) == {}
    assert "1 pass(es) drawn with replacement" in found[1].detail


@pytest.mark.parametrize(
    "batch, factor, passes",
    [(4, 1, True), (5, 1, False), (4, 2, False), (2, 2, True)],
    ids=["global", "rounded-down", "per-process-unkept", "per-process"],
)
def test_the_processes_train_on_the_original_s_global_batch(batch, factor, passes):
    """bench33 F2 (lstmcls): `batch_size = 5` on 2 processes loads 2 each, a global batch
    of 4 (25 steps an epoch, not 20). With `--per-process-batch` (`factor` 2) each keeps
    the original's batch. The most common batch counts (an epoch's last one is smaller)."""
    original = Run(
        {**ORIGINAL.record, "sample_ids": [[1, list(range(batch))]] * 3 + [[1, [0]]]}, 0, ""
    )
    found = _failed(checks(original, _run(_rank(0), _rank(1)), batch_factor=factor))
    assert ("processes train on different data" not in found) is passes
    if batch == 5:
        assert found["processes train on different data"] == (
            "the processes train on a global batch of 4 samples a step where the original trains"
            " on 5: 5 does not divide by 2 processes, and each loads its share rounded down;"
            " give a batch size that divides by the number of processes"
        )


@pytest.mark.parametrize("converted_exit, passes", [("ok", True), ("max-steps", False)])
def test_processes_stopped_before_the_end_the_original_reached_fail(converted_exit, passes):
    """bench33 lstmcls: the original ran to its end in 15 steps (3 epochs of 5), the
    processes (7 steps an epoch) were stopped after 20: their epoch ends, the figure and
    the pickle written after the epochs, went unchecked."""
    original = Run({**ORIGINAL.record, "exit": "ok"}, 0, "")
    found = checks(original, _run(_rank(0, exit=converted_exit), _rank(1, exit=converted_exit)))
    assert found[0].passed is passes
    if not passes:
        assert len(found) == 1 and found[0].detail == (
            "the original ran to its end in 4 steps; the processes were stopped after 4,"
            " before theirs"
        )


def test_processes_without_loader_indices_must_not_compute_the_same_losses():
    same = checks(ORIGINAL, _run(_rank(0, sample_ids=[None] * 4), _rank(1, sample_ids=[None] * 4)))
    assert "they train on the same data" in _failed(same)["processes train on different data"]


@pytest.mark.parametrize(
    "first, second, passes, detail",
    [
        ([["a"], ["b"]], [["c"], ["d"]], True, "different tensors in 2 of the first 2 steps"),
        # the same windows on both: their losses differ only by the dropout seeded per process
        ([["a"], ["b"]], [["a"], ["b"]], False, "in 2 of the first 2 steps, two processes fed"),
        ([["a"], ["b"]], [["a"], ["c"]], True, "different tensors in 1 of the first 2 steps"),
        ([], [], False, "not proven"),
    ],
)
def test_processes_without_loader_indices_are_told_apart_by_what_their_models_received(
    first, second, passes, detail
):
    """Their losses differ in every case: that alone proves nothing."""
    no_indices = [None] * 4
    ranks = [
        _rank(0, sample_ids=no_indices, batch_prints=first),
        _rank(1, sample_ids=no_indices, batch_prints=second, losses=[1.1, 0.7, 0.6, 0.5]),
    ]
    (check,) = [c for c in checks(ORIGINAL, _run(*ranks)) if c.name == DIFFERENT_DATA]
    assert check.passed is passes and detail in check.detail


def test_a_summed_loss_left_unscaled_shows_as_half_the_loss():
    halves = [loss / 2 for loss in ORIGINAL.record["losses"]]
    failed = _failed(checks(ORIGINAL, _run(_rank(0, losses=halves), _rank(1, losses=halves))))
    assert (
        list(failed) == ["loss close to the original's"]
        and "50.0% apart" in failed["loss close to the original's"]
    )


@pytest.mark.parametrize(
    "rank1, reason",
    [
        ({"exit": "error: stopped after 60 s (a process hung, or the steps take longer)"}, "hung"),
        ({"losses": [1.0, 0.8]}, "[2, 4] steps: they did not stop together"),
    ],
    ids=["hang", "stopped-apart"],
)
def test_a_run_that_does_not_finish_together_fails_first(rank1, reason):
    found = checks(
        ORIGINAL, Run({"losses": [], "exit": "ok"}, 0, "", [_rank(0), _rank(1, **rank1)])
    )
    assert len(found) == 1 and not found[0].passed and reason in found[0].detail


def test_verify_is_for_ddp_and_script_arguments_need_it(cli, tmp_path):
    (tmp_path / "train.py").write_text("print(1)\n")
    single = cli("convert", "train.py", "--verify")
    assert (
        single.exit_code == 2
        and "--verify checks --to ddp and --to fsdp conversions" in single.stderr
    )
    stray = cli("convert", "train.py", "other.py")
    assert stray.exit_code == 2 and "unexpected arguments 'other.py'" in stray.stderr


# -- runs ------------------------------------------------------------------------------------
def _convert(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """`autoaccel convert ARGS` in `cwd`, with the session's environment (it also runs on
    the background threads, while other tests set variables of their own)."""
    return run_autoaccel("convert", *args, cwd=cwd, timeout=600)


def _verify(shared: SessionRuns, name: str) -> tuple[subprocess.CompletedProcess, Path]:
    """`convert --to ddp --verify` of ddp fixture `name`, in a folder of its own."""
    folder = shared.folder(f"verify-{name.removesuffix('.py')}")
    proc = _convert(str(DDP_FIXTURES / name), *DDP_OPTIONS, "--verify", "--verify-steps", "30",
                    "-o", "ddp.py", cwd=folder)  # fmt: skip
    return proc, folder


def start_runs(shared: SessionRuns, tests: list) -> dict[str, Future]:
    """The selected fixtures' `--verify` runs, in the background (see running.py)."""
    tests = [
        test for test in tests if test.originalname == "test_each_ddp_fixture_converts_and_verifies"
    ]
    return {name: shared.start(_verify, name) for name in selected(tests)}


verified = runs_fixture(start_runs)


@pytest.mark.runs
@pytest.mark.parametrize(
    "name",
    [
        "summed_loss.py",
        "stop_on_loss.py",
        "fresh_batches.py",
        "gan_batch_shapes.py",
        "step_receives_model.py",
        "gan_samples.py",
        "frozen_teacher.py",
        "running_average.py",
        "imported_encoder.py",
        "printed_samples.py",
        "printed_translation.py",
        "loader_subclass.py",
        "flow_loss_module.py",
        "trainer_epoch_method.py",
        "random_offsets_with_eval.py",
        "sampler_in_branch.py",
        "factory_returns_model.py",
        "early_stopping_epochs.py",  # before: a process left the epoch loop alone, the other crashed
        "iteration_passes.py",  # before: the same order in every pass
        "phase_loop.py",  # before: refused (the validation branch's batch size), set_epoch missing
        "constant_buffer.py",  # before: DDP's buffer broadcast crashed on a strided `pe`
        "epoch_function.py",  # before: the epoch's training, inside a print, ran on rank 0 only
    ],
)
def test_each_ddp_fixture_converts_and_verifies(name, verified):
    """Each fixture converts without a refusal and its conversion passes --verify on two
    processes: disjoint data, equal parameters, one writer, the original's loss."""
    proc, folder = verified[name].result()
    assert proc.returncode == 0, proc.stderr
    # the check lines, not the progress lines (`--verify: running ...`) printed off a terminal
    verdicts = [
        line
        for line in proc.stderr.splitlines()
        if line.startswith(("--verify ok", "--verify FAIL"))
    ]
    assert len(verdicts) == 7 and all(
        line.startswith("--verify ok") for line in verdicts
    ), proc.stderr
    assert (folder / "ddp.py").exists()
    assert not list(folder.glob("*.pt")) and not list(folder.glob("*.ckpt")), "saves go to scratch"


@pytest.mark.runs
def test_the_proof_reaches_the_end_and_refuses_a_global_batch_rounded_down(tmp_path):
    """fixtures/ddp/epoch_end_plot (bench33 lstmcls): the original runs its 3 epochs (cut
    to 5 steps) to the end in 15 steps; the processes, 2 samples a step each, need 21.
    Stopped at 20, they never reached the end (nor the curve written after the epochs);
    their global batch of 4 went unseen."""
    shutil.copytree(DDP_FIXTURES / "epoch_end_plot", tmp_path, dirs_exist_ok=True)
    proc = _convert("train.py", *DDP_OPTIONS, "-o", "ddp.py", cwd=tmp_path)
    assert proc.returncode == 1 and not (tmp_path / "ddp.py").exists(), proc.stderr
    assert "every process finishes: 2 processes, 21 steps each" in proc.stderr
    assert "one process writes each file: 1 file(s) written" in proc.stderr
    assert (
        "FAIL processes train on different data: the processes train on a global batch of 4"
        " samples a step where the original trains on 5" in proc.stderr
    )


@pytest.mark.runs
def test_tensorboard_logs_come_from_rank_zero_only(tmp_path):
    """fixtures/ddp/tensorboard_logs.py: two processes write one event file, with the
    original's lines (each sample is stored twice, so the shards hold the same samples).
    Before, each process wrote its own file into the folder."""
    fixture = DDP_FIXTURES / "tensorboard_logs.py"
    proc = _convert(
        str(fixture), "--to", "ddp", "--amp", "off", "-o", "ddp.py", "--no-verify", cwd=tmp_path
    )
    assert proc.returncode == 0 and "TensorBoard writer made on rank 0 only" in proc.stdout
    stubs = Path(__file__).resolve().parent / "stubs"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(stubs)}
    (tmp_path / "original").mkdir()
    runs = [
        subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=300, env=env)
        for command, cwd in (
            ([sys.executable, str(fixture)], tmp_path / "original"),
            (
                [
                    sys.executable,
                    "-m",
                    "torch.distributed.run",
                    "--standalone",
                    "--nproc_per_node=2",
                    "ddp.py",
                ],
                tmp_path,
            ),
        )
    ]
    assert all(run.returncode == 0 for run in runs), runs[1].stderr[-2000:]
    (original,) = (tmp_path / "original" / "logs").iterdir()
    (converted,) = (tmp_path / "logs").iterdir()
    assert converted.read_text() == original.read_text() and original.read_text().count("\n") == 12


@pytest.mark.runs
def test_a_validation_loader_the_code_cannot_tell_apart_is_left_whole(tmp_path):
    """fixtures/ddp/logged_validation.py (melgan's shape) with the training loader's flag
    given as `bool(1)`, which the conversion does not read (a literal `True` it does).
    Sharded too, the validation loader made rank 0 log the sum over its half divided by
    the whole set's size: half the original's (the proof refused it). Now the short run
    tells the helper's loaders apart: the validation one stays whole, and the logged
    value is the original's."""
    stubs = Path(__file__).resolve().parent / "stubs"
    source = (DDP_FIXTURES / "logged_validation.py").read_text()
    unread = source.replace("torch.randn(64, 1)), True)", "torch.randn(64, 1)), bool(1))")
    assert unread != source
    (tmp_path / "logged_validation.py").write_text(unread)
    proc = run_autoaccel(
        "convert", "logged_validation.py", "--to", "ddp", "--amp", "off",
        "--verify", "--verify-steps", "8", "-o", "ddp.py",
        cwd=tmp_path, env={"PYTHONPATH": str(stubs)}, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "no backward() followed any of its" in proc.stdout
    assert f"--verify ok   {VALUES}" in proc.stderr
    assert (tmp_path / "ddp.py").read_text().count("DistributedSampler(") == 1


@pytest.mark.runs
def test_a_printed_forward_of_a_sharded_model_runs_on_every_process(tmp_path):
    """Under FSDP a forward gathers the parameters from every process: the printed
    `translate(x)`, which reads the global model, is computed on every process before
    the rank-0 print. Before, it ran on rank 0 alone and both processes aborted."""
    fixture = str(DDP_FIXTURES / "printed_translation.py")
    proc = _convert(fixture, "--to", "fsdp", "--amp", "off", "--verify", "--verify-steps", "12",
                    "-o", "fsdp.py", cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "computed on every process before the rank-0 print" in proc.stdout
    assert "--verify FAIL" not in proc.stderr and (tmp_path / "fsdp.py").exists()


@pytest.mark.runs
@pytest.mark.parametrize(
    "good, broken, reason, steps",
    [
        (
            "DistributedSampler(dataset, shuffle=False)",
            "DistributedSampler(dataset, shuffle=False, num_replicas=1, rank=0)",
            "trained on by more than one process",
            24,
        ),
        ("ddp_model = DDP(", "unused = DDP(", "gradients are not synchronised", 24),
        (
            "(loss * WORLD_SIZE).backward()",
            "loss.backward()",
            "FAIL loss close to the original",
            24,
        ),
        # 4 steps of a 6-step epoch: only an epoch cut short (after 1 step) shows the
        # epoch's printed average, halved when divided by the whole set's size
        (
            "total / len(loader.sampler)",
            "total / len(loader.dataset)",
            "off by the number of processes",
            4,
        ),
    ],
    ids=["unsharded", "unsynchronised", "unscaled-sum", "average-past-the-steps"],
)
def test_a_broken_conversion_fails_verify_and_nothing_is_written(
    good, broken, reason, steps, tmp_path, monkeypatch, capsys, session_runs
):
    """A good conversion of summed_loss.py (made once for all), broken on purpose the
    ways real conversions were wrong: each fails with its reason, and the CLI writes
    nothing."""
    from autoaccel.convert import command

    good_text = session_runs.convert(DDP_FIXTURES / "summed_loss.py", *DDP_OPTIONS).read_text()
    assert good in good_text
    real_convert = command.convert_source

    def broken_conversion(*args, **kwargs):
        result = real_convert(*args, **kwargs)
        return type(result)(result.original, good_text.replace(good, broken), result.log)

    monkeypatch.setattr(command, "convert_source", broken_conversion)
    monkeypatch.chdir(tmp_path)
    from autoaccel.convert.verify import VerifyRequest

    status = command.run_convert(
        DDP_FIXTURES / "summed_loss.py", _ddp_options(), output=tmp_path / "out.py",
        verify=VerifyRequest([], steps=steps, timeout=120),
    )  # fmt: skip
    assert status == 1 and not (tmp_path / "out.py").exists()
    err = capsys.readouterr().err
    assert reason in err and "error: --verify failed (see above); nothing written" in err


def _ddp_options():
    from autoaccel.convert.log import ConvertOptions

    return ConvertOptions(target="ddp", amp="off")


@pytest.mark.runs
@pytest.mark.parametrize(
    "name, change, printed",
    [
        ("summed_loss.py", "evaluation on a share of the set per process", ("held-out",)),
        (
            "running_average.py",
            "divides a sum over this process's shard by its size",
            ("[", "epoch"),
        ),
    ],
)
def test_the_converted_script_prints_the_originals_numbers(name, change, printed, tmp_path):
    """Two processes print what the original prints. summed_loss.py: each evaluates every
    second held-out sample and the sums are all-reduced. running_average.py: rank 0
    divides its shard's sums by its shard's counts (each sample is stored twice, so the
    shards hold the same samples; dividing by the whole set's counts printed half)."""
    proc = _convert(str(DDP_FIXTURES / name), "--to", "ddp", "--amp", "off", "-o", "ddp.py", "--no-verify",
                    cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 0 and change in proc.stdout
    runs = [
        run_script(DDP_FIXTURES / name, cwd=tmp_path),
        run_ranks(tmp_path / "ddp.py", [], tmp_path),
    ]
    assert all(run.returncode == 0 for run in runs), runs[1].stderr[-2000:]
    lines = [[line for line in run.stdout.splitlines() if line.startswith(printed)] for run in runs]
    assert lines[0] and lines[0] == lines[1]


def test_verify_prints_a_line_per_run_when_stderr_is_no_terminal(monkeypatch, capsys, tmp_path):
    """In a CI log a spinner shows nothing: each run says when it starts."""
    from autoaccel.convert import command
    from autoaccel.convert.verify import VerifyRequest

    def two_runs(script, write_conversion, request, import_roots, on_status, original):
        on_status("original script, 1 process")
        on_status("converted script, 2 processes (gloo)")
        return [Check("every process finishes", True, "2 of 2")], ""

    monkeypatch.setattr(command, "verify_ddp", two_runs)
    assert command.verified(
        tmp_path / "train.py", lambda folder: (folder, []), VerifyRequest([]), []
    )
    assert capsys.readouterr().err.splitlines() == [
        "--verify: running the original script, 1 process ...",
        "--verify: running the converted script, 2 processes (gloo) ...",
        "--verify ok   every process finishes: 2 of 2",
    ]
