"""Proof by running: every fixture trains the same after `autoaccel convert`.

Each fixture is converted with the default options (`--amp bf16`), then the original and the
conversion run on CPU under `autoaccel.run.harness`, which records the loss of every backward
call. The conversion enables autocast only on CUDA (`enabled=device.type == "cuda"`), so on
this CPU it computes in float32 like the original: its first epoch must print the original's
losses exactly. Run again with `AUTOACCEL_FORCE_AUTOCAST=1` (the harness then enables every
autocast region, as on a GPU), the bf16 conversion must run and end near the original.

Why only the first epoch is compared step by step for some fixtures: the conversion adds
`persistent_workers=True` to the DataLoaders. A DataLoader draws one seed from the global
torch RNG each time an iterator is created (`_BaseDataLoaderIter._base_seed`); with
persistent workers the iterator is created once and reused, so from the second epoch on the
converted script draws one number fewer per loader per epoch. The global RNG therefore runs
out of step from epoch 2: a shuffled loader (`RandomSampler` seeds itself from the global RNG)
yields other batches, and dropout draws other masks. Epoch 1 is untouched, so it must match
to float rounding; after that only the end of training is compared, with a tolerance.
"""

from __future__ import annotations

import math
from concurrent.futures import Future
from dataclasses import dataclass

import pytest

from cpu_kernels import missing_bf16_kernel, skip_without_bf16
from running import FIXTURES_DIR, SessionRuns, fixture_names, runs_fixture, selected

pytest.importorskip("torch")

# Step-by-step agreement of the default conversion is exact (==): on a CPU autocast is
# disabled, and cudnn.benchmark, loader workers, pin_memory and non_blocking are no-ops for
# the values, so every operation runs on the same float32 inputs in the same order.
FORCED_BF16 = {"AUTOACCEL_FORCE_AUTOCAST": "1"}
# Agreement to float rounding, for the single-process ddp runs of test_convert_ddp_runs.py.
EXACT_REL = 1e-5


@dataclass(frozen=True)
class Case:
    args: tuple[str, ...]
    steps_per_epoch: int  # backward calls per epoch (the GAN makes 3 per batch)
    rng_shifts: bool  # shuffled loader or dropout fed by a DataLoader loop: see module docstring
    off_tol: float  # relative tolerance on the final loss of the CPU run (rng_shifts only)
    bf16_tol: float  # relative tolerance on the final loss with bf16 autocast forced on
    # Layers that some CPUs cannot run in bf16 (see cpu_kernels.py): where one cannot, the
    # forced bf16 run is skipped and says why.
    bf16_layers: tuple[str, ...] = ()


# "Final loss" below is the mean loss of the last epoch's steps: a single step's loss swings
# by 10-30 % from batch to batch on these tiny data sets, the epoch mean is what training
# actually changes. Tolerances: measured gap (2 epochs, 2-core CPU, torch 2.13) x ~2-3 margin;
# the measured numbers are the comment on each line (CPU gap / forced bf16 gap of the last-epoch
# mean; the CPU gaps were measured with `--amp off`, which computes what the default conversion
# computes on a CPU). Forced bf16 on CPU: torch.autocast("cpu", bfloat16) runs matmul/conv/linear/LSTM in bf16 (8-bit
# mantissa, ~0.4 % per op), losses in float32; over 2 epochs that stays within ~1 %.
CASES = {
    "cnn_toplevel.py": Case((), 8, True, 0.05, 0.05),  # 1.59 % / 1.61 %
    "dataparallel_existing.py": Case((), 16, True, 0.03, 0.03),  # 0.92 % / 0.92 %
    "gan.py": Case((), 48, True, 0.002, 0.002),  # 0.003 % / 0.010 %
    # No shuffle, no dropout: must match on every step.
    "linear_exact.py": Case(("--save-params", "params.pt"), 16, False, 0.0, 0.01),  # exact / 0.28 %
    # Dropout, but manual batching without a DataLoader: nothing touches the RNG, every step matches.
    "lstm_lm.py": Case((), 24, False, 0.0, 0.001, bf16_layers=("LSTM",)),  # exact / 0.003 %
    # Dropout; its loaders are built from **kwargs dicts (unshuffled on CPU).
    # Two dropout layers (0.25, 0.5) on 12 steps an epoch: from epoch 2 the converted run draws
    # other dropout masks (persistent_workers), which moves the epoch-2 mean by ~8 %.
    "mnist_main.py": Case(("--save-model",), 12, True, 0.12, 0.12),  # 8.2 % / 9.1 %
    "trainer_class.py": Case((), 16, True, 0.03, 0.03),  # 0.70 % / 0.63 %
    # The step spread over methods / helper functions (found through calls).
    "trainer_methods.py": Case((), 8, True, 0.08, 0.08),  # 2.88 % / 2.97 %
    "step_functions.py": Case((), 8, True, 0.08, 0.08),  # 2.97 % / 2.75 %
    "transformer_accum.py": Case((), 24, True, 0.02, 0.02),  # 0.26 % / 0.13 %
    "resnet_cifar.py": Case((), 8, True, 0.05, 0.12),  # 2.01 % / 4.82 %
    "transformer_lm.py": Case((), 8, True, 0.002, 0.002),  # 0.002 % / 0.002 %
    # WeightedRandomSampler on the global RNG: epoch 2 draws shift with persistent_workers.
    "imbalanced_resume.py": Case((), 16, True, 0.15, 0.15),
}
LEGACY = "legacy_pytorch03.py"


def _job(shared: SessionRuns, name: str) -> dict[str, list[float] | None]:
    """The losses of the original, the conversion, and the conversion with bf16 forced on
    (None where this CPU cannot run it)."""
    case = CASES[name]
    converted = shared.convert(name)
    bf16_runs = not any(missing_bf16_kernel(layer) for layer in case.bf16_layers)
    return {
        "orig": shared.run(FIXTURES_DIR / name, case.args).losses,
        "cpu": shared.run(converted, case.args).losses,
        "bf16": shared.run(converted, case.args, FORCED_BF16).losses if bf16_runs else None,
    }


def start_runs(shared: SessionRuns, tests: list) -> dict[str, Future]:
    """Each selected fixture's runs, in the background (see running.py)."""
    return {name: shared.start(_job, name) for name in selected(tests)}


loss_runs = runs_fixture(start_runs)


def final_loss(losses: list[float], case: Case) -> float:
    last = losses[-case.steps_per_epoch :]
    return sum(last) / len(last)


def rel_gap(a: float, b: float) -> float:
    return abs(a - b) / max(abs(a), 1e-12)


def test_cases_cover_every_fixture():
    assert set(fixture_names()) == set(CASES) | {LEGACY}


@pytest.mark.runs
@pytest.mark.parametrize("name", sorted(CASES))
def test_default_conversion_on_cpu_matches_original_exactly(name, loss_runs):
    case = CASES[name]
    runs = loss_runs[name].result()
    orig, cpu = runs["orig"], runs["cpu"]
    assert len(cpu) == len(orig) == 2 * case.steps_per_epoch
    exact = case.steps_per_epoch if case.rng_shifts else len(orig)
    for step, (a, b) in enumerate(zip(orig[:exact], cpu[:exact])):
        assert b == a, f"step {step}: original {a}, converted {b}"
    if case.rng_shifts:
        gap = rel_gap(final_loss(orig, case), final_loss(cpu, case))
        assert (
            gap <= case.off_tol
        ), f"final loss differs by {gap:.2%} (tolerance {case.off_tol:.0%})"


@pytest.mark.runs
@pytest.mark.parametrize("name", sorted(CASES))
def test_forced_bf16_trains_close_to_original(name, loss_runs):
    case = CASES[name]
    skip_without_bf16(case.bf16_layers)
    runs = loss_runs[name].result()
    orig, bf16 = runs["orig"], runs["bf16"]
    assert len(bf16) == len(orig)
    assert all(math.isfinite(v) for v in bf16)
    gap = rel_gap(final_loss(orig, case), final_loss(bf16, case))
    assert gap <= case.bf16_tol, f"final loss differs by {gap:.2%} (tolerance {case.bf16_tol:.0%})"


@pytest.mark.runs
def test_legacy_script_runs_after_conversion(session_runs):
    original = session_runs.run(FIXTURES_DIR / LEGACY)
    assert original.returncode != 0
    assert "IndexError: invalid index of a 0-dim tensor" in original.stderr, original.stderr[-3000:]

    losses = session_runs.run(session_runs.convert(LEGACY)).losses
    assert len(losses) == 16  # 2 epochs x 8 batches
    assert all(math.isfinite(v) for v in losses)
