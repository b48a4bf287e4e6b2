"""A training DataLoader built in the call that takes it (`train(model, DataLoader(...),
opt)`, `Trainer(DataLoader(...)).train()`): `NameTrainLoader` builds it first as
`train_loader`, which the later steps shard as any assigned loader. fixtures/ddp/
inline_loader.py against its snapshots (tests/snapshots/inline_loader/, regenerated with
AUTOACCEL_UPDATE_SNAPSHOTS=1); its run on two processes is in
tests/test_convert_inline_loader_runs.py."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest
from test_convert_ddp import run_step
from test_facts import DDP, FSDP, wrong

from autoaccel.convert.pipeline import convert_source
from autoaccel.convert.transforms.distributed.name_train_loader import NameTrainLoader

FIXTURE = Path(__file__).resolve().parent.parent / "fixtures" / "ddp" / "inline_loader.py"
SNAPSHOTS = Path(__file__).resolve().parent / "snapshots" / "inline_loader"
UPDATE = os.environ.get("AUTOACCEL_UPDATE_SNAPSHOTS") == "1"

TRAINER = textwrap.dedent("""\
    import torch
    import torch.nn as nn
    from torch.utils.data import DataLoader, TensorDataset


    class Trainer:
        def __init__(self, loader):
            self.model = nn.Linear(8, 2)
            self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.1)
            self.loader = loader

        def train(self):
            for epoch in range(2):
                for x, y in self.loader:
                    loss = nn.functional.cross_entropy(self.model(x), y)
                    self.optimizer.zero_grad()
                    loss.backward()
                    self.optimizer.step()


    x = torch.randn(64, 8)
    y = (x[:, 0] > 0).long()
    Trainer(DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True)).train()
    """)
TRAIN_FUNCTION = textwrap.dedent("""\
    import torch
    from torch.utils.data import DataLoader


    def train(model, loader, optimizer):
        for x, y in loader:
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            optimizer.step()


    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    """)


@pytest.mark.parametrize("options", [DDP, FSDP], ids=["ddp", "fsdp"])
def test_fixture_matches_snapshot(options):
    conversion = convert_source(FIXTURE.read_text(), options, FIXTURE.name)
    assert wrong(conversion) == []
    snapshot = SNAPSHOTS / f"inline_loader.{options.target}.py"
    if UPDATE:
        SNAPSHOTS.mkdir(exist_ok=True)
        snapshot.write_text(conversion.converted)
    assert conversion.converted == snapshot.read_text()


def test_a_trainer_s_inline_loader_is_sharded_and_its_sampler_set_each_epoch():
    conversion = convert_source(TRAINER, DDP, "train.py")
    assert wrong(conversion) == []
    code = conversion.converted
    assert (
        "train_dataset = TensorDataset(x, y)\n"
        "train_sampler = DistributedSampler(train_dataset, shuffle=True) if DISTRIBUTED else None\n"
        "train_loader = DataLoader(\n"
        "    train_dataset,\n"
        "    batch_size=per_process_batch_size(16),\n"
        "    shuffle=train_sampler is None,\n"
        "    sampler=train_sampler,\n"
        ")\n"
    ) in code
    assert "\nTrainer(train_loader).train()\n" in code
    assert (
        "            if DISTRIBUTED:\n                self.loader.sampler.set_epoch(epoch)\n"
        in code
    )
    assert convert_source(code, DDP, "train.py").converted == code


def test_the_loader_is_built_before_the_statement_that_takes_it():
    code, log = run_step(
        NameTrainLoader,
        TRAIN_FUNCTION + "train(model, DataLoader(data, batch_size=8), optimizer)\n",
    )
    assert code.endswith(
        "train_loader = DataLoader(data, batch_size=8)\ntrain(model, train_loader, optimizer)\n"
    )
    assert log.changes[0].description == (
        "training DataLoader built first, as `train_loader`, to be sharded"
    )


def test_the_loader_s_name_is_one_the_script_does_not_use():
    code, _ = run_step(
        NameTrainLoader,
        TRAIN_FUNCTION
        + "train_loader = None\nresult = train(model, DataLoader(data), optimizer)\n",
    )
    assert (
        "train_loader2 = DataLoader(data)\nresult = train(model, train_loader2, optimizer)\n"
        in code
    )


@pytest.mark.parametrize(
    "statement",
    [
        "train(model, DataLoader(data) if data else None, optimizer)",  # built only if `data`
        "train(model, given or DataLoader(data), optimizer)",  # built only without `given`
        "if train(model, DataLoader(data), optimizer):\n    pass",  # a compound statement
        "train(model, DataLoader(data), optimizer); data = None",  # two statements in one line
        "loader = DataLoader(data)\ntrain(model, loader, optimizer)",  # named already
    ],
    ids=["condition", "or", "compound", "two-statements", "named"],
)
def test_a_loader_is_left_where_it_is(statement):
    code, log = run_step(NameTrainLoader, TRAIN_FUNCTION + statement + "\n")
    assert code.endswith(statement + "\n")
    assert log.changes == []
