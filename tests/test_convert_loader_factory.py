"""`--to ddp` of a training DataLoader whose sampler argument is always None (SupContrast's
`train_sampler = None`), and of a factory that makes every split's loader in one call
(LTSF-Linear's `data_provider(args, flag)`): only the training call's loader is sharded."""

from __future__ import annotations

from pathlib import Path

import pytest

from autoaccel.convert.log import ConvertOptions
from autoaccel.convert.pipeline import convert_source

DDP_FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "ddp"
DDP = ConvertOptions(target="ddp", amp="off")
SAMPLER_NONE = DDP_FIXTURES / "sampler_none.py"
FACTORY = DDP_FIXTURES / "loader_factory_split.py"


def convert(path: Path, source: str | None = None):
    return convert_source(path.read_text() if source is None else source, DDP, str(path))


def function(code: str, name: str) -> str:
    """The text of the top-level function `name` of `code`."""
    start = code.index(f"\ndef {name}(")
    return code[start + 1 : code.index("\n\n", start + 1)]


def refusals(conversion) -> list[str]:
    return [s.reason for s in conversion.log.skipped if s.what == "DistributedSampler"]


def test_a_sampler_that_is_always_none_is_replaced_by_the_distributed_one():
    conversion = convert(SAMPLER_NONE)
    assert function(conversion.converted, "set_loader") == (
        "def set_loader(batch_size):\n"
        "    train_dataset = TensorDataset(torch.randn(64, 4), torch.randn(64, 1))\n"
        "    train_sampler = (\n"
        "        DistributedSampler(train_dataset, shuffle=True) if DISTRIBUTED else None\n"
        "    )\n"
        "    train_loader = DataLoader(\n"
        "        train_dataset,\n"
        "        batch_size=per_process_batch_size(batch_size),\n"
        "        shuffle=(train_sampler is None),\n"
        "        sampler=train_sampler,\n"
        "    )\n"
        "    return train_loader"
    )
    assert [c.line for c in conversion.log.changes if "training DataLoader" in c.description] == [
        14
    ]
    assert not any("already has a sampler" in s.reason for s in conversion.log.skipped)


def test_a_literal_shuffle_beside_a_none_sampler_moves_into_the_sampler():
    source = SAMPLER_NONE.read_text().replace("shuffle=(train_sampler is None)", "shuffle=True")
    code = " ".join(convert(SAMPLER_NONE, source).converted.split())
    assert "DistributedSampler(train_dataset, shuffle=True) if DISTRIBUTED else None" in code
    assert "shuffle=train_sampler is None, sampler=train_sampler" in code


@pytest.mark.parametrize(
    "old, new",
    [
        # a real sampler reaches the argument too
        (
            "    train_sampler = None\n",
            "    train_sampler = None\n    if batch_size > 8:\n"
            "        train_sampler = torch.utils.data.SequentialSampler(train_dataset)\n",
        ),
        # `None`, but in another block than the loader's
        (
            "    train_sampler = None\n",
            "    if True:\n        train_sampler = None\n",
        ),
    ],
)
def test_a_sampler_that_may_be_set_is_left_to_the_user(old, new):
    conversion = convert(SAMPLER_NONE, SAMPLER_NONE.read_text().replace(old, new))
    assert "DistributedSampler(" not in conversion.converted
    assert any("already has a sampler" in r for r in refusals(conversion))


def test_a_dataset_made_after_the_none_is_refused_with_its_line():
    source = SAMPLER_NONE.read_text().replace(
        "    train_dataset = TensorDataset(torch.randn(64, 4), torch.randn(64, 1))\n"
        "    train_sampler = None\n",
        "    train_sampler = None\n"
        "    train_dataset = TensorDataset(torch.randn(64, 4), torch.randn(64, 1))\n",
    )
    assert refusals(convert(SAMPLER_NONE, source)) == [
        "the training DataLoader's sampler is"
        " `train_sampler = None` (no sampler), but its dataset is not made before that line:"
        " make a DistributedSampler of the dataset in its place by hand"
    ]


def test_only_the_training_split_of_a_factory_is_sharded():
    conversion = convert(FACTORY)
    body = function(conversion.converted, "data_provider")
    assert body.endswith(
        "    data_sampler = (\n"
        "        DistributedSampler(data_set, shuffle=shuffle_flag)\n"
        '        if DISTRIBUTED and flag == "train"\n'
        "        else None\n"
        "    )\n"
        "    data_loader = DataLoader(\n"
        "        data_set,\n"
        "        batch_size=(\n"
        "            per_process_batch_size(batch_size)\n"
        "            if data_sampler is not None\n"
        "            else batch_size\n"
        "        ),\n"
        "        shuffle=shuffle_flag and data_sampler is None,\n"
        "        sampler=data_sampler,\n"
        "    )\n"
        "    return data_set, data_loader"
    )
    changed = [c for c in conversion.log.changes if "training DataLoader" in c.description]
    assert [(c.line, c.description) for c in changed] == [
        (
            19,
            "training DataLoader reads its own shard through DistributedSampler (the"
            ' shuffle moves into the sampler), made only where `flag` is "train", as in the'
            " calls the training loops read: `data_provider()`'s other loaders stay whole;"
            " per-process batch = global batch // WORLD_SIZE",
        )
    ]


@pytest.mark.parametrize(
    "replaced",
    [
        # every call is the training one: nothing else to keep whole
        {'flag="val"': 'flag="train"', 'flag="test"': 'flag="train"'},
        # a flag the analysis cannot read for the training call
        {'flag="train"': 'flag=str("train")'},
    ],
)
def test_a_factory_without_a_readable_training_split_shards_every_call(replaced):
    source = FACTORY.read_text()
    for old, new in replaced.items():
        assert old in source
        source = source.replace(old, new)
    code = " ".join(convert(FACTORY, source).converted.split())
    assert "DistributedSampler(data_set, shuffle=shuffle_flag) if DISTRIBUTED else None" in code


BOOL_FACTORY = """
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset


def make_loader(data, train):
    return DataLoader(data, batch_size=8, shuffle=train)


if __name__ == "__main__":
    model = nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    train_loader = make_loader(TensorDataset(torch.randn(64, 4), torch.randn(64, 1)), True)
    val_loader = make_loader(TensorDataset(torch.randn(16, 4), torch.randn(16, 1)), False)
    for x, y in train_loader:
        loss = ((model(x) - y) ** 2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    with torch.no_grad():
        print(sum(((model(x) - y) ** 2).sum().item() for x, y in val_loader))
"""


def test_a_boolean_flag_selects_the_training_call():
    code = " ".join(convert(FACTORY, BOOL_FACTORY).converted.split())
    assert (
        "sampler = DistributedSampler(data, shuffle=train) if DISTRIBUTED and train else None"
        in code
    )
