"""`convert` on scripts written in other styles: each converts, the result runs on a CPU-only
machine, and there (autocast enabled only on CUDA) it trains exactly like the original;
with bf16 autocast forced on by the harness it ends near it.

None of these scripts shuffles or uses dropout, so the one RNG draw per epoch that
`persistent_workers=True` saves cannot change their losses: every step must match.
"""

from __future__ import annotations

import math
from concurrent.futures import Future
from pathlib import Path

import pytest

from running import HarnessRun, SessionRuns, runs_fixture, selected

STYLES_DIR = Path(__file__).resolve().parent / "styles"
SCRIPTS = sorted(p.name for p in STYLES_DIR.glob("*.py"))
# Changes each script must get, as (rule code, text that must appear in the result).
# (accel_top and cuda_calls_class read in-memory TensorDatasets: no workers, see ACC101.)
EXPECTED = {
    "accel_top.py": [
        ("ACC102", "pin_memory=torch.cuda.is_available()"),
        ("ACC103", "x.to(device, non_blocking=True)"),
        ("ACC301", "device_type=device.type"),
    ],
    "cuda_calls_class.py": [
        ("ACC103", "x.cuda(non_blocking=True)"),
        ("ACC201", "torch.backends.cudnn.benchmark = True"),
    ],
    # The generator's autocast output reaches the discriminator outside the block (in the
    # BCE loss, kept out of autocast): cast back, or bf16 fails in the first conv layer.
    "dcgan_two_models.py": [
        ("ACC301", "adversarial_loss(discriminator(gen_imgs.float()), valid)"),
        ("ACC301", "discriminator(gen_imgs.detach().float())"),
        ("ACC301", "nn.functional.mse_loss(\n                validity.float()"),
    ],
    # `device` is a string here: autocast must not call `device.type` on it.
    "string_device_fn.py": [
        ("ACC103", "inputs.to(device, non_blocking=True)"),
        ("ACC504", "with torch.no_grad():"),
        ("ACC301", 'device_type="cuda" if torch.cuda.is_available() else "cpu"'),
    ],
}


def test_every_style_script_has_expectations():
    assert set(SCRIPTS) == set(EXPECTED)


def _job(shared: SessionRuns, name: str) -> tuple[str, dict[str, HarnessRun]]:
    """The bf16 conversion of style script `name`, and the runs of it and of the original."""
    original = STYLES_DIR / name
    bf16 = shared.convert(original, "--amp", "bf16")
    return bf16.read_text(encoding="utf-8"), {
        "orig": shared.run(original),
        "cpu": shared.run(bf16),
        "bf16": shared.run(bf16, (), {"AUTOACCEL_FORCE_AUTOCAST": "1"}),
    }


def start_runs(shared: SessionRuns, tests: list) -> dict[str, Future]:
    """Each selected script's runs, in the background (see running.py)."""
    return {name: shared.start(_job, name) for name in selected(tests)}


style_runs = runs_fixture(start_runs)


@pytest.mark.runs
@pytest.mark.parametrize("name", SCRIPTS)
def test_style_converts_and_trains_like_the_original(name, style_runs):
    converted, harness_runs = style_runs[name].result()
    for code, text in EXPECTED[name]:
        assert text in converted, f"{code}: expected {text!r} in the converted {name}"

    runs = {label: run.losses for label, run in harness_runs.items()}
    assert runs["cpu"] == runs["orig"]
    assert len(runs["bf16"]) == len(runs["orig"])
    assert all(math.isfinite(v) for v in runs["bf16"])
    final_orig, final_bf16 = runs["orig"][-1], runs["bf16"][-1]
    assert abs(final_bf16 - final_orig) <= 0.05 * abs(final_orig)
