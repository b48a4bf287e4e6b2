"""A model that a step function and an evaluation function receive as their parameter,
called from a loop elsewhere (pytorch/examples' gcn): neither function is a place to
wrap or shard the model, since each runs once per step. Before, `--to fsdp` put
`shard_model(model)` after `evaluate`'s `return` or at the end of `train_step`, and
exited 0; which of the two depended on the objects' hashes, so it changed between runs."""

from __future__ import annotations

import pytest

from autoaccel.convert.log import ConvertOptions
from autoaccel.convert.pipeline import convert_source

SCRIPT = """\
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def train_step(model, optimizer, x, y):
    optimizer.zero_grad()
    loss = nn.functional.mse_loss(model(x), y)
    loss.backward()
    optimizer.step()


def evaluate(model, x, y):
    with torch.no_grad():
        return nn.functional.mse_loss(model(x), y).item()


if __name__ == "__main__":
    net = nn.Linear(4, 1)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    loader = DataLoader(TensorDataset(torch.randn(64, 4), torch.randn(64, 1)), batch_size=8)
    for x, y in loader:
        train_step(net, optimizer, x, y)
        print(evaluate(net, x, y))
"""
LOOP_LINE = SCRIPT.splitlines().index("    for x, y in loader:") + 1


@pytest.mark.parametrize(("target", "step"), [("ddp", "DistributedDataParallel"), ("fsdp", "fully_shard")])
def test_a_model_received_by_the_step_function_is_refused_at_the_loop(target, step):
    conversion = convert_source(SCRIPT, ConvertOptions(target=target, amp="off"), "train.py")

    refused = [(item.what, item.line) for item in conversion.log.skipped if item.wrong]
    assert refused == [(step, LOOP_LINE)]
    assert "shard_model(model)" not in conversion.converted
    assert "DDP(model" not in conversion.converted
