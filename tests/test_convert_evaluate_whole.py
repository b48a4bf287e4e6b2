"""An evaluation that reads the sharded training loader evaluates the whole training set
(fixtures/ddp/evaluate_train_set.py, a ViT solver's `test(train=True)`): before, rank 0
printed the accuracy and count of its shard, 32 of 64 samples, and the proof passed."""

from __future__ import annotations

import pytest
from running import FIXTURES_DIR, _check, run_ranks

from autoaccel.convert.log import ConvertOptions
from autoaccel.convert.pipeline import convert_source

FIXTURE = FIXTURES_DIR / "ddp" / "evaluate_train_set.py"


def _converted(target: str) -> str:
    options = ConvertOptions(target=target, amp="off")
    conversion = convert_source(FIXTURE.read_text(), options, "train.py")
    assert not [s for s in conversion.log.skipped if s.wrong]
    return conversion.converted


@pytest.mark.parametrize("target", ["ddp", "fsdp"])
def test_the_evaluation_loop_reads_the_whole_training_set(target):
    text = _converted(target)
    assert "            for x, y in whole(loader):\n" in text
    assert "    if not isinstance(loader.sampler, torch.utils.data.DistributedSampler):\n" in text
    assert text.count(" in whole(") == 1  # the evaluation; the training loop reads its shard
    assert "            for x, y in self.train_loader:\n" in text


@pytest.mark.runs
def test_rank_zero_prints_the_whole_set_s_numbers(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(_converted("ddp"))
    ranks = run_ranks(script, (), tmp_path)
    _check(ranks, "the converted solver")
    assert "train accuracy 0.688 of 64 samples" in ranks.stdout  # the original's line
