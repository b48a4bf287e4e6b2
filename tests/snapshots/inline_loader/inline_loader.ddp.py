"""A training DataLoader built in the call that trains on it, `train(model, DataLoader(...),
optimizer)`: it is named nowhere. Shuffled, with one batch per epoch: whatever the order,
each step averages the gradient of all the samples (a mean loss, no dropout), so two
processes, each on its half, reach the original's parameters."""

import gc
import os
import warnings

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

# Distributed training: torchrun starts one process per GPU and sets RANK, LOCAL_RANK
# and WORLD_SIZE. Run with plain `python`, the script is a single process, as before.
DISTRIBUTED = "LOCAL_RANK" in os.environ
RANK = int(os.environ.get("RANK", 0))
LOCAL_RANK = int(os.environ.get("LOCAL_RANK", 0))
WORLD_SIZE = int(os.environ.get("WORLD_SIZE", 1))
if DISTRIBUTED:
    dist.init_process_group("gloo", init_method="env://")


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


def train(model, loader, optimizer, epochs=3):
    for epoch in range(epochs):
        if DISTRIBUTED:
            loader.sampler.set_epoch(epoch)
        for inputs, targets in loader:
            loss = nn.functional.mse_loss(model(inputs), targets)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        if RANK == 0:
            print(f"epoch {epoch}: loss {loss.item():.4f}")


if __name__ == "__main__":
    torch.manual_seed(0)
    inputs = torch.randn(32, 4)
    targets = inputs.sum(dim=1, keepdim=True)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    # trained through DDP when distributed: gradients are averaged in backward()
    ddp_model = model
    if DISTRIBUTED:
        ddp_model = DDP(
            model, device_ids=[LOCAL_RANK] if next(model.parameters()).is_cuda else None
        )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    train_dataset = TensorDataset(inputs, targets)
    train_sampler = (
        DistributedSampler(train_dataset, shuffle=True) if DISTRIBUTED else None
    )
    train_loader = DataLoader(
        train_dataset,
        batch_size=per_process_batch_size(32),
        shuffle=train_sampler is None,
        sampler=train_sampler,
    )
    # Same model and data on every process so far; from here each draws its own random
    # numbers (noise, dropout, augmentation), as the GPUs of one big batch would.
    if DISTRIBUTED:
        torch.manual_seed(torch.initial_seed() + RANK)
    train(ddp_model, train_loader, optimizer)

    if DISTRIBUTED:
        # free the models first: left to the exit, they can abort the process
        del model, ddp_model
        gc.collect()
        dist.destroy_process_group()
