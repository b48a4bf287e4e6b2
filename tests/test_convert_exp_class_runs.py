"""tests/test_convert_exp_class.py's fixture (fixtures/facts/exp_base_class/) converted
with its default proof (two processes, gloo): it passes, with equal parameters on both
ranks after training and the checkpoint written by one process. `--to fsdp` refuses the
checkpointing call (the model it is given is sharded) after the facts run, before any
proof run."""

from __future__ import annotations

import pytest
from running import FIXTURES_DIR, convert_in_copy

pytest.importorskip("torch")
pytestmark = pytest.mark.runs


def convert(tmp_path, target: str):
    args = ("--to", target, "-o", tmp_path / "out", "--", "--epochs", "2")
    return convert_in_copy(tmp_path, FIXTURES_DIR / "facts" / "exp_base_class", "main.py", *args)


def test_converted_experiment_class_passes_its_proof(tmp_path):
    proc = convert(tmp_path, "ddp")
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output
    assert "--verify ok   parameters equal on every process" in output
    assert "--verify ok   one process writes each file: 1 file(s) written" in output


def test_fsdp_refuses_the_call_that_is_given_the_sharded_model(tmp_path):
    """Every process must gather the state dict before rank 0 saves it: tools.py's
    `save_checkpoint()` guarded on rank 0 alone hung the proof run for its whole timeout."""
    proc = convert(tmp_path, "fsdp")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "exp_model.py:67:1: error: rank-0 checkpoint save not applied" in proc.stderr
    assert "it is given the sharded `self.model`" in proc.stderr
    assert "--verify" not in proc.stdout + proc.stderr
    assert not (tmp_path / "out").exists()
