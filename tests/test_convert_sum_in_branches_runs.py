"""fixtures/ddp/mean_over_batch_size.py (DeepLab's loss: a cross entropy averaged over the
pixels, then divided again by the batch's size) converted with `--to ddp` and its default
proof (two processes, gloo): the divisor becomes the whole batch's (`n * WORLD_SIZE`) and
the proof passes. Before, the conversion left it as it was and the proof failed: loss and
gradient twice the original's (99.7% apart). (Its printed number is the loss of the step
just done, which the loss check compares; the check of printed averages leaves it out.)"""

from __future__ import annotations

import shutil

import pytest
from running import FIXTURES_DIR, run_autoaccel

pytest.importorskip("torch")
pytestmark = pytest.mark.runs


def test_a_mean_over_the_batchs_size_converts_and_passes_its_proof(tmp_path):
    shutil.copy(FIXTURES_DIR / "ddp" / "mean_over_batch_size.py", tmp_path / "train.py")
    args = ("train.py", "--to", "ddp", "--amp", "off", "-o", "out.py")
    proc = run_autoaccel("convert", *args, cwd=tmp_path)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output
    assert "--verify ok   loss close to the original's" in output
    assert "loss /= n * WORLD_SIZE" in (tmp_path / "out.py").read_text()
