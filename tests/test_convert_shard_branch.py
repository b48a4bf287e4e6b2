"""A helper that makes the training DataLoader in one branch and the validation one in
another (melgan's `create_dataloader(hp, args, train)`): only the branch the training
loops get is sharded; the other is left whole, each process reading all of it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_facts import FACTS_FIXTURES, absolute

from autoaccel.convert.log import ConvertOptions
from autoaccel.convert.pipeline import convert_source
from autoaccel.facts.model import RunFacts
from autoaccel.facts.resolve import ConversionFacts

ROOT = Path(__file__).resolve().parent.parent
DDP_FIXTURES = ROOT / "fixtures" / "ddp"
FACTS = Path(__file__).resolve().parent / "snapshots" / "shard_branch" / "loader_by_mode.json"
DDP = ConvertOptions(target="ddp", amp="off")
LEFT_WHOLE = "no training DataLoader: "


def convert(path: Path, source: str | None = None, facts: RunFacts | None = None):
    source = path.read_text() if source is None else source
    given = None if facts is None else ConversionFacts(facts, path, source)
    return convert_source(source, DDP, str(path), given)


def notes(conversion) -> list[tuple[int | None, str]]:
    return [(s.line, s.reason) for s in conversion.log.skipped if LEFT_WHOLE in s.reason]


@pytest.mark.parametrize(
    "name, validation, training, line",
    [
        (
            "loader_by_flag.py",
            "        return DataLoader(data, batch_size=4, shuffle=False)\n",
            15,
            17,
        ),
        # `if train: return ...` and the validation loader after it (no `else`)
        (
            "logged_validation.py",
            "    return DataLoader(data, batch_size=4, shuffle=False)\n",
            19,
            20,
        ),
    ],
)
def test_only_the_branch_the_training_loop_gets_is_sharded(name, validation, training, line):
    conversion = convert(DDP_FIXTURES / name)
    code = conversion.converted
    assert validation in code and code.count("DistributedSampler(") == 1
    assert "sampler = DistributedSampler(data, shuffle=True) if DISTRIBUTED else None" in code
    changed = [c for c in conversion.log.changes if "training DataLoader" in c.description]
    assert [c.line for c in changed] == [training]  # the training branch only
    assert notes(conversion) == [
        (
            line,
            "no training DataLoader: `make_loader()` makes it only where `train` is False, and"
            " the training loops read its calls with `train=True`; left whole: each process"
            " reads all of it",
        )
    ]


def test_the_validation_average_keeps_the_whole_set():
    """`len(loader.dataset)` of the validation loop stays: its loader is not sharded."""
    code = convert(DDP_FIXTURES / "loader_by_flag.py").converted
    assert 'print(f"validation loss {total / len(loader.dataset):.6f}")' in code


@pytest.mark.parametrize(
    "old, new",
    [
        ("for x, y in train_loader:", "for x, y in itertools.chain(train_loader, val_loader):"),
        ("TensorDataset(torch.randn(64, 4), torch.randn(64, 1)), True)", "TensorDataset("
         "torch.randn(64, 4), torch.randn(64, 1)), __name__ == '__main__')"),  # not a literal
    ],
)  # fmt: skip
def test_a_flag_the_analysis_cannot_read_keeps_both_sharded(old, new):
    path = DDP_FIXTURES / "loader_by_flag.py"
    source = path.read_text()
    assert old in source
    conversion = convert(path, "import itertools\n" + source.replace(old, new))
    assert conversion.converted.count("DistributedSampler(") == 2 and notes(conversion) == []


def test_the_run_tells_which_loader_trains():
    """fixtures/facts/loader_by_mode.py: `if mode == "train":`, which no literal decides
    here. Without facts both loaders are sharded; with the facts of a run (the first fed
    every backward(), the second none of its 4 batches) the second is left whole."""
    path = FACTS_FIXTURES / "loader_by_mode.py"
    assert convert(path).converted.count("DistributedSampler(") == 2
    facts = RunFacts.from_json(absolute(json.loads(FACTS.read_text())))
    assert [(x.batches, x.trains) for x in facts.loaders] == [(5, True), (4, False)]
    conversion = convert(path, facts=facts)
    code = conversion.converted
    assert "    return DataLoader(data, batch_size=4)\n" in code
    assert code.count("DistributedSampler(") == 1
    assert notes(conversion) == [
        (
            14,
            "no training DataLoader: the run of the script showed it: no backward() followed"
            " any of its 4 batches, while one followed those of another DataLoader; left whole:"
            " each process reads all of it",
        )
    ]
