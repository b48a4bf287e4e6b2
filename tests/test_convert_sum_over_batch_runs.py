"""fixtures/ddp/sum_over_batch_size.py (a VAE's loss: a sum divided by the batch's own size,
a mean per sample) converted with `--to ddp` and its default proof (two processes, gloo):
nothing is scaled and the proof passes. Before, the conversion refused the loss as a sum
mixed with other terms; following that refusal's advice (`(loss * WORLD_SIZE).backward()`)
fails this proof: the loss is 134% off the original's."""

from __future__ import annotations

import shutil

import pytest
from running import FIXTURES_DIR, run_autoaccel

pytest.importorskip("torch")
pytestmark = pytest.mark.runs


def test_a_sum_over_the_batchs_size_converts_and_passes_its_proof(tmp_path):
    shutil.copy(FIXTURES_DIR / "ddp" / "sum_over_batch_size.py", tmp_path / "train.py")
    args = ("train.py", "--to", "ddp", "--amp", "off", "-o", "out.py")
    proc = run_autoaccel("convert", *args, cwd=tmp_path)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output
    assert "Proven by a run on 2 CPU processes:" in output
    assert "loss close to the original's" in output
    assert "WORLD_SIZE).backward()" not in (tmp_path / "out.py").read_text()
