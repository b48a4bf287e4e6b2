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


def test_a_test_loader_the_script_shards_itself_is_left_as_it_is():
    """Horovod's examples shard the test set too and average the metrics over the
    processes: read whole, each process's sum would be divided by its shard's size."""
    source = (
        FIXTURE.read_text()
        .replace(
            "self.test_loader = DataLoader(TensorDataset(x[64:], y[64:]), batch_size=8)",
            "test_set = TensorDataset(x[64:], y[64:])\n"
            "        test_sampler = DistributedSampler(test_set)\n"
            "        self.test_loader = DataLoader(test_set, batch_size=8, sampler=test_sampler)",
        )
        .replace(
            "    def test(self, train=False):\n        loader = self.train_loader if train else self.test_loader\n",
            "    def test(self, train=False):\n        loader = self.test_loader\n",
        )
    )
    source = "from torch.utils.data import DistributedSampler\n" + source
    conversion = convert_source(source, ConvertOptions(target="ddp", amp="off"), "train.py")
    assert "def whole(" not in conversion.converted and " in whole(" not in conversion.converted
