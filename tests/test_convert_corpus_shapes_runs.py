"""The fixtures of tests/test_convert_corpus_shapes.py converted and run on two processes
(gloo, CPU; each rank forked with torchrun's environment by `running.run_ranks`), with
what each must show: the WGAN-GP critic sharded once trains under FSDP (the second
`fully_shard` raised), the VAE's evaluation calls `model.decode(z)` on the sharded model
(it mixed Tensor and DTensor), the regression fits one target and stops (each process
fitted its own and never did), and the progress bar is written once."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from autoaccel.convert.log import ConvertOptions
from autoaccel.convert.pipeline import convert_source
from running import FIXTURES_DIR, run_ranks

pytestmark = pytest.mark.runs


def run_converted(name: str, target: str, folder: Path):
    """Fixture `name` converted with `--to target --amp off` into `folder`, run there on
    two ranks; each must finish."""
    source = (FIXTURES_DIR / name).read_text()
    script = folder / Path(name).name
    options = ConvertOptions(target=target, amp="off")  # type: ignore[arg-type]
    script.write_text(convert_source(source, options, script.name).converted)
    proc = run_ranks(script, (), folder)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


@pytest.mark.parametrize("target", ["fsdp", "ddp"])
def test_a_wgan_gp_critic_trains_on_two_processes(target, tmp_path):
    proc = run_converted("fsdp/wgan_gp.py", target, tmp_path)
    assert re.findall(r"^epoch (\d): d_loss", proc.stdout, re.M) == ["0", "1"]  # rank 0's


def test_a_sharded_vae_decodes_in_its_evaluation(tmp_path):
    proc = run_converted("fsdp/vae_methods.py", "fsdp", tmp_path)
    samples = re.findall(
        r"^epoch \d: loss [\d.]+, code [\d.]+, sample ([\d.]+)$", proc.stdout, re.M
    )
    assert len(samples) == 3


def test_an_unseeded_regression_fits_one_target_and_stops(tmp_path):
    """Both processes fit rank 0's polynomial: the loss gets under 1e-3 (the original
    needs ~100 batches; with a target each, 2,000 were not enough)."""
    proc = run_converted("ddp/random_target.py", "ddp", tmp_path)
    batches = int(re.search(r"after (\d+) batches", proc.stdout)[1])  # type: ignore[index]
    assert batches < 1000


def test_the_progress_bar_and_figures_come_from_rank_zero(tmp_path):
    proc = run_converted("ddp/progress_plots.py", "ddp", tmp_path)
    # the 8 steps of rank 0's last epoch (a shard of 128 samples, 16 a step); not rank 1's
    assert proc.stdout.count("] epoch 2 loss") == 8
    assert (tmp_path / "losses.png").stat().st_size and (tmp_path / "fits.gif").stat().st_size
