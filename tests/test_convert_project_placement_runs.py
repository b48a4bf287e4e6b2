"""Proof by running: fixtures/projects/epoch_helper_loop (epoch loop in train.py, batch
loop in `loops.run_epoch()`, loader in data.py) converted `--to ddp` and `--to fsdp`
trains on two processes (torchrun, gloo): each epoch's shards disjoint and complete, a
new shuffle every epoch, only rank 0 saving, and the checkpoint holding the bare model's
keys (no `module.` prefix) and its whole tensors."""

from __future__ import annotations

import pytest

from running import FIXTURES_DIR, _check, run_autoaccel
from test_convert_ddp_runs import run_torchrun

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.runs

SCRIPT = FIXTURES_DIR / "projects" / "epoch_helper_loop" / "train.py"
TRAIN_SIZE = 128
SAVED = "epoch_helper_loop.pt"


@pytest.mark.parametrize("target", ["ddp", "fsdp"])
def test_epoch_helper_project_trains_on_two_processes(target, tmp_path):
    out = tmp_path / target
    proc = run_autoaccel(
        "convert", SCRIPT, "--to", target, "--amp", "off", "-o", out, "--no-verify", cwd=tmp_path
    )
    _check(proc, f"autoaccel convert epoch_helper_loop/train.py --to {target} -o DIR")
    ranks = run_torchrun(out / "train.py", (), out)
    assert [r["exit"] for r in ranks] == ["ok", "ok"]
    passes = [[p for p in r["passes"] if p["size"] == TRAIN_SIZE] for r in ranks]
    assert [p["epoch"] for p in passes[0]] == [0, 1], "set_epoch is not called every epoch"
    assert passes[0][0]["indices"] != passes[0][1]["indices"], "the same order every epoch"
    for first, second in zip(*passes):
        assert not set(first["indices"]) & set(second["indices"])
        assert set(first["indices"]) | set(second["indices"]) == set(range(TRAIN_SIZE))
    assert ranks[0]["saves"] == [SAVED] and ranks[1]["saves"] == []
    saved = torch.load(out / SAVED)
    assert sorted(saved["net"]) == ["0.bias", "0.weight", "2.bias", "2.weight"]
    assert saved["net"]["0.weight"].shape == (24, 6)  # whole, not one shard
