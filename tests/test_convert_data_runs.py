"""Proof by running: the data pipeline of `imbalanced_resume.py` after `--to dp|ddp`.

Under `torchrun --nproc_per_node=2` (gloo, CPU) its WeightedRandomSampler keeps its
weights: the two processes read one weighted draw between them, half each. And a
checkpoint saved by the original, under nn.DataParallel (`module.` keys), loads into
the converted scripts, which no longer wrap the model.
"""

from __future__ import annotations

import pytest

from running import FIXTURES_DIR
from test_convert_ddp_runs import run_torchrun, _job as ddp_runs_of

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.runs

NAME = "imbalanced_resume.py"
MAJORITY = 448  # samples of class 0 come first; 64 of class 1 follow
STEPS_PER_EPOCH = 512 // 32


def test_two_processes_read_one_weighted_draw(session_runs):
    # the run of the same conversion that tests/test_convert_ddp_runs.py checks
    ranks = session_runs.start(ddp_runs_of, NAME).result()["ranks"]
    assert [r["exit"] for r in ranks] == ["ok", "ok"]
    assert [len(r["losses"]) for r in ranks] == [2 * STEPS_PER_EPOCH] * 2  # the global batch kept
    read = [[i for _, ids in r["sample_ids"] for i in ids] for r in ranks]
    assert len(read[0]) == len(read[1]) == 512  # 2 epochs x half of 512 draws
    assert read[0] != read[1]  # each its own share, not the same samples
    minority = sum(i >= MAJORITY for share in read for i in share) / (2 * 512)
    # Uniform sampling would give 64/512 = 12.5 %; balanced weights give half.
    assert 0.4 < minority < 0.6, f"class 1 is {minority:.1%} of the samples read"


@pytest.mark.parametrize("target", ["dp", "ddp"])
def test_checkpoint_saved_under_data_parallel_loads_after_conversion(
    tmp_path, session_runs, target
):
    original = session_runs.run(FIXTURES_DIR / NAME, ()).check()
    checkpoint = original.cwd / "imbalanced.pt"
    converted = session_runs.convert(NAME, "--to", target, "--amp", "off")
    args = ("--resume", str(checkpoint), "--epochs", "1", "--save", str(tmp_path / "resumed.pt"))
    if target == "ddp":
        ranks = run_torchrun(converted, args, tmp_path)
        assert [r["exit"] for r in ranks] == ["ok", "ok"]
    else:
        session_runs.run(converted, args).check()

    keys = list(torch.load(tmp_path / "resumed.pt"))
    assert keys and not any(k.startswith("module.") for k in keys)
    assert all(k.startswith("module.") for k in torch.load(checkpoint))
