"""Proof by running: projects of several files converted `--to ddp` into a folder train on
two processes.

- fixtures/packaged: the training loop in `toygpt/trainer.py`, the loader in
  `toygpt/data.py`. Plain `python` trains like the original (one process: no sampler, the
  whole batch; the same steps exactly in the first epoch).
- fixtures/projects/trainer_module: a `Trainer` in `trainer.py` that accumulates gradients
  over two batches, its backward pass in a method `fit()` calls; the micro-steps go under
  `no_sync()`. Plain `python` gives the same losses, step for step.

Under `torchrun --nproc_per_node=2` (gloo, CPU) the probe of tests/test_convert_ddp_runs.py
shows each epoch's shards of the training set disjoint and complete, a new shuffle every
epoch, only rank 0 saving, and the final loss close to the original's.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from running import FIXTURES_DIR, _check, run_autoaccel, run_with_losses
from test_convert_ddp_runs import run_torchrun
from test_convert_runs import EXACT_REL, rel_gap

pytest.importorskip("torch")
pytestmark = pytest.mark.runs

PACKAGED = FIXTURES_DIR / "packaged" / "train.py"
TRAINER_MODULE = FIXTURES_DIR / "projects" / "trainer_module" / "train.py"
STEPS_PER_EPOCH = 16  # both: 512 sequences in batches of 32; 256 samples in batches of 16
# Last-epoch mean loss, measured (2 epochs, torch 2.13, 2-core CPU). packaged: original
# 1.2455; one process 1.2446 (0.06 %: epoch 2 is shuffled otherwise); two ranks 1.2392
# (0.50 %). trainer_module: original 0.5851; two ranks 0.5803 (0.8 %). Two ranks differ
# because the DistributedSampler shuffles with its own generator.
SINGLE_TOL = 0.05
DDP_TOL = 0.1


def last_epoch(losses: list[float]) -> float:
    return sum(losses[-STEPS_PER_EPOCH:]) / STEPS_PER_EPOCH


def converted_project(script: Path, tmp_path: Path) -> Path:
    """`autoaccel convert SCRIPT --to ddp -o DIR`: the folder of the converted project."""
    out = tmp_path / "ddp"
    proc = run_autoaccel(
        "convert", script, "--to", "ddp", "--amp", "off", "-o", out, "--no-verify", cwd=tmp_path
    )
    _check(proc, f"autoaccel convert {script.parent.name}/{script.name} --to ddp -o DIR")
    return out


def check_two_ranks(
    script: Path, tmp_path: Path, original: list[float], train_size: int, saved: str
) -> None:
    """Two processes: the training set's shards disjoint and complete every epoch, a new
    shuffle each epoch, only rank 0 saving `saved`, the final loss near the original's."""
    (tmp_path / "ranks").mkdir()
    ranks = run_torchrun(script, (), tmp_path / "ranks")
    assert [r["exit"] for r in ranks] == ["ok", "ok"]
    assert [len(r["losses"]) for r in ranks] == [len(original)] * 2, "the global batch changed"
    train_passes = [[p for p in r["passes"] if p["size"] == train_size] for r in ranks]
    assert [p["epoch"] for p in train_passes[0]] == [0, 1], "set_epoch is not called every epoch"
    for first, second in zip(*train_passes):
        assert first["epoch"] == second["epoch"]
        assert not set(first["indices"]) & set(second["indices"])
        assert set(first["indices"]) | set(second["indices"]) == set(range(train_size))
    assert ranks[0]["saves"] == [saved] and ranks[1]["saves"] == []
    gap = rel_gap(last_epoch(original), sum(last_epoch(r["losses"]) for r in ranks) / len(ranks))
    assert gap <= DDP_TOL, f"final loss differs by {gap:.2%}"


def test_packaged_project_trains_on_two_processes(tmp_path, session_runs):
    out = converted_project(PACKAGED, tmp_path)
    original = session_runs.run(PACKAGED).losses
    (tmp_path / "single").mkdir()
    single = run_with_losses(out / "train.py", (), tmp_path / "single")
    assert len(single) == len(original)
    # the first epoch exactly; then persistent DataLoader workers draw no new base seed
    # from the global RNG, so the shuffle of epoch 2 differs (tests/test_convert_runs.py)
    assert single[:STEPS_PER_EPOCH] == pytest.approx(original[:STEPS_PER_EPOCH], rel=EXACT_REL)
    gap = rel_gap(last_epoch(original), last_epoch(single))
    assert gap <= SINGLE_TOL, f"final loss differs by {gap:.2%}"
    check_two_ranks(out / "train.py", tmp_path, original, 512, "toygpt.pt")


def test_trainer_module_trains_on_two_processes(tmp_path, session_runs):
    out = converted_project(TRAINER_MODULE, tmp_path)
    assert "no_sync()" in (out / "trainer.py").read_text()
    original = session_runs.run(TRAINER_MODULE).losses
    assert len(original) == 2 * STEPS_PER_EPOCH
    (tmp_path / "single").mkdir()
    single = run_with_losses(out / "train.py", (), tmp_path / "single")
    assert single == pytest.approx(original, rel=EXACT_REL)
    check_two_ranks(out / "train.py", tmp_path, original, 256, "trainer_module.pt")
