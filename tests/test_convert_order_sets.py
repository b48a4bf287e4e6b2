"""Sets read in sorted order by the multi-process conversions (`OrderSetsAlike`): a
vocabulary numbered in the order of a set of strings differs from process to process,
whose hashes torchrun leaves seeded at random (the ninth unseen set's char-RNN).
fixtures/ddp/set_vocabulary.py."""

from __future__ import annotations

from textwrap import dedent

import pytest
from running import FIXTURES_DIR, run_script

from autoaccel.convert.log import ConvertOptions
from autoaccel.convert.pipeline import convert_source

FIXTURE = FIXTURES_DIR / "ddp" / "set_vocabulary.py"


def convert(source: str, target: str = "ddp"):
    return convert_source(source, ConvertOptions(target=target, amp="off"), "train.py")


def training_script(data_lines: str) -> str:
    """A script that trains on a DataLoader after `data_lines` (at the top level)."""
    return (
        dedent("""\
        import torch
        import torch.nn as nn
        from torch.utils.data import DataLoader, TensorDataset

        words = "a b c a b".split()
        """)
        + dedent(data_lines)
        + dedent("""\
        loader = DataLoader(TensorDataset(torch.randn(8, 2), torch.randn(8, 1)), batch_size=2)
        model = nn.Linear(2, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for x, y in loader:
            loss = nn.functional.mse_loss(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        """)
    )


@pytest.mark.parametrize(
    "before, after",
    [
        ("chars = list(set(words))\n", "chars = sorted(set(words))\n"),
        (
            "index = {w: i for i, w in enumerate(set(words))}\n",
            "index = {w: i for i, w in enumerate(sorted(set(words)))}\n",
        ),
        ("order = tuple({w for w in words})\n", "order = tuple(sorted({w for w in words}))\n"),
        ('line = " ".join(frozenset(words))\n', 'line = " ".join(sorted(frozenset(words)))\n'),
        (
            "vocab = set(words)\nitos = list(vocab)\n",
            "vocab = set(words)\nitos = sorted(vocab)\n",
        ),
        (
            "vocab = set(words)\nfor w in vocab:\n    print(w)\n",
            "vocab = set(words)\nfor w in sorted(vocab):\n",
        ),
    ],
    ids=["list", "enumerate", "set-comprehension", "join", "bound-name", "for"],
)
def test_an_ordered_read_of_a_set_is_sorted(before, after):
    conversion = convert(training_script(before))
    assert after in conversion.converted
    (change,) = [c for c in conversion.log.changes if "sorted order" in c.description]
    assert change.line == 5 + after.count("\n")  # the read's line
    assert convert(conversion.converted).log.changes == [], "a second pass changes nothing"


@pytest.mark.parametrize(
    "lines",
    [
        "chars = sorted(set(words))\n",
        "chars = sorted(list(set(words)))\n",
        "count = len(set(words))\n",
        "vocab = set(words)\nvocab = list(words)\nitos = list(vocab)\n",
        "tensors = list(set(torch.nn.Linear(2, 1).parameters()))\n",
    ],
    ids=["sorted", "sorted-list", "unordered-use", "rebound-name", "parameters"],
)
def test_other_sets_and_reads_stay(lines):
    conversion = convert(training_script(lines))
    assert dedent(lines) in conversion.converted
    assert not [c for c in conversion.log.changes if "sorted order" in c.description]


def test_one_process_targets_keep_the_set_order():
    source = training_script("chars = list(set(words))\n")
    for target in ("single", "dp"):
        assert "chars = list(set(words))\n" in convert(source, target).converted


@pytest.mark.runs
def test_the_converted_vocabulary_no_longer_depends_on_the_hash_seed(tmp_path):
    """Two hash seeds, as two torchrun processes get: the original trains on a
    different numbering of its characters under each (other losses), the conversion
    on the same one (the same losses, as both processes of one run need)."""
    original = tmp_path / "train.py"
    original.write_text(FIXTURE.read_text(encoding="utf-8"))
    converted = tmp_path / "converted.py"
    converted.write_text(convert(original.read_text(), "fsdp").converted)

    def losses(script):
        return [run_script(script, env={"PYTHONHASHSEED": seed}).stdout for seed in ("1", "2")]

    first, second = losses(original)
    assert first != second
    first, second = losses(converted)
    assert first == second and "epoch 1: loss" in first
