"""A regression on a table of rows batched by hand, as older time-series and tabular scripts
do (LSTNet's `get_batches`): every epoch a `torch.randperm` of the training rows is cut into
batches; the evaluation reads the validation rows in order through the same helper. The first
column of a row is its id / 100."""
import argparse
import gc
import os
import warnings

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

# Distributed training: torchrun starts one process per GPU and sets RANK, LOCAL_RANK
# and WORLD_SIZE. Run with plain `python`, the script is a single process, as before.
DISTRIBUTED = "LOCAL_RANK" in os.environ
RANK = int(os.environ.get("RANK", 0))
LOCAL_RANK = int(os.environ.get("LOCAL_RANK", 0))
WORLD_SIZE = int(os.environ.get("WORLD_SIZE", 1))
if DISTRIBUTED:
    dist.init_process_group("gloo", init_method="env://")


def shard_rows(rows):
    """This process's rows: every WORLD_SIZE-th from its RANK, as many on every process
    (the last `len(rows) % WORLD_SIZE` are left out), so that all take as many steps."""
    return rows[RANK : len(rows) - len(rows) % WORLD_SIZE : WORLD_SIZE]


def per_process_batch_size(global_batch_size):
    """Each process loads an equal share of the original (global) batch."""
    share = max(1, global_batch_size // WORLD_SIZE)
    if global_batch_size % WORLD_SIZE:
        warnings.warn(
            f"batch size {global_batch_size} does not divide by {WORLD_SIZE} processes:"
            f" each loads {share}, {share * WORLD_SIZE} in all; give a batch size that"
            f" divides by {WORLD_SIZE} to keep the global batch"
        )
    return share


parser = argparse.ArgumentParser()
parser.add_argument("--batch_size", type=int, default=8)
parser.add_argument("--epochs", type=int, default=2)
args = parser.parse_args()
torch.manual_seed(0)


def get_batches(inputs, targets, batch_size, shuffle=True):
    length = len(inputs)
    index = torch.randperm(length) if shuffle else torch.arange(length)
    for start in range(0, length, batch_size):
        excerpt = index[start:start + batch_size]
        yield inputs[excerpt], targets[excerpt]


rows = torch.arange(71, dtype=torch.float32)
data_x = torch.stack([rows / 100, torch.sin(rows / 5), torch.cos(rows / 7), torch.randn(71)], 1)
data_y = 2 * data_x[:, 1:2] + data_x[:, 2:3]
train_x, train_y = data_x[:55], data_y[:55]
valid_x, valid_y = data_x[55:], data_y[55:]

model = nn.Linear(4, 1)
# trained through DDP when distributed: gradients are averaged in backward()
ddp_model = model
if DISTRIBUTED:
    ddp_model = DDP(
        model, device_ids=[LOCAL_RANK] if next(model.parameters()).is_cuda else None
    )
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
criterion = nn.MSELoss()


def evaluate(inputs, targets):
    model.eval()
    total = 0.0
    with torch.no_grad():
        for x, y in get_batches(inputs, targets, args.batch_size, False):
            total += criterion(model(x), y).item() * len(x)
    return total / len(inputs)


# Same model and data on every process so far; from here each draws its own random
# numbers (noise, dropout, augmentation), as the GPUs of one big batch would.
if DISTRIBUTED:
    torch.manual_seed(torch.initial_seed() + RANK)
for epoch in range(args.epochs):
    model.train()
    for x, y in get_batches(
        shard_rows(train_x),
        shard_rows(train_y),
        per_process_batch_size(args.batch_size),
        True,
    ):
        loss = criterion(ddp_model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    if RANK == 0:
        print(f"epoch {epoch}: valid loss {evaluate(valid_x, valid_y):.4f}")

if DISTRIBUTED:
    # free the models first: left to the exit, they can abort the process
    del ddp_model
    gc.collect()
    dist.destroy_process_group()
