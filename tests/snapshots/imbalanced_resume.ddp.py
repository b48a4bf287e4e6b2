"""Imbalanced classifier: a WeightedRandomSampler balances the classes, the model is
wrapped in nn.DataParallel, and a run can resume from the checkpoint of an earlier one.

What a conversion must keep: the sampler's weights (under ddp each process draws its
share of the weighted indices, never a uniform DistributedSampler's), and old
checkpoints, saved under nn.DataParallel with `module.`-prefixed keys, must still load
once the conversion has removed the wrapper.
Slow patterns on purpose: nn.DataParallel, blocking .to(device) copies, loss.item()
every step.
"""
import argparse
import gc
import os
import warnings

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset, WeightedRandomSampler

# Distributed training: torchrun starts one process per GPU and sets RANK, LOCAL_RANK
# and WORLD_SIZE. Run with plain `python`, the script is a single process, as before.
DISTRIBUTED = "LOCAL_RANK" in os.environ
RANK = int(os.environ.get("RANK", 0))
LOCAL_RANK = int(os.environ.get("LOCAL_RANK", 0))
WORLD_SIZE = int(os.environ.get("WORLD_SIZE", 1))
if DISTRIBUTED:
    if torch.cuda.is_available():
        torch.cuda.set_device(LOCAL_RANK)  # "cuda" now means this process's GPU
    # nccl for CUDA tensors, gloo for CPU tensors
    backend = "cpu:gloo,cuda:nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend, init_method="env://")


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


class ShardedDraws(torch.utils.data.Sampler):
    """Each process reads its share of what `sampler` draws: all draw the same indices
    (one generator, seeded alike) and each keeps every WORLD_SIZE-th from its RANK.
    Together they read exactly one draw of the original sampler, weights and all."""

    def __init__(self, sampler):
        if sampler.generator is None:  # the global RNG, which each process re-seeds
            seed = torch.tensor(torch.initial_seed() % 2**63)
            dist.broadcast(seed, src=0)
            sampler.generator = torch.Generator().manual_seed(int(seed))
        self.sampler = sampler

    def __iter__(self):
        indices = list(self.sampler)
        # equal shares (padded with the first indices, as DistributedSampler pads)
        indices += indices[: -len(indices) % WORLD_SIZE]
        return iter(indices[RANK::WORLD_SIZE])

    def __len__(self):
        return -(-len(self.sampler) // WORLD_SIZE)


parser = argparse.ArgumentParser(description="Imbalanced classes, weighted sampling")
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("--batch-size", type=int, default=32)
parser.add_argument("--lr", type=float, default=0.05)
parser.add_argument("--seed", type=int, default=0)
parser.add_argument("--resume", type=str, default=None, help="checkpoint to start from")
parser.add_argument("--save", type=str, default="imbalanced.pt")
args = parser.parse_args()

torch.manual_seed(args.seed)
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")


class Jittered(Dataset):
    """Samples rescaled as they are read: per-sample work, as an augmentation would be."""

    def __init__(self, features, labels):
        self.features, self.labels = features, labels

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, index):
        return self.features[index] * 1.01, self.labels[index]


# 448 samples of class 0, 64 of class 1: without weights a batch holds 1/8 of class 1
g = torch.Generator().manual_seed(7)
labels = torch.cat([torch.zeros(448, dtype=torch.long), torch.ones(64, dtype=torch.long)])
features = torch.randn(512, 6, generator=g) + labels.unsqueeze(1) * 0.8
dataset = Jittered(features, labels)
class_counts = torch.bincount(labels).double()
sampler = WeightedRandomSampler(1.0 / class_counts[labels], num_samples=len(labels))
train_loader = DataLoader(
    dataset,
    batch_size=per_process_batch_size(args.batch_size),
    sampler=ShardedDraws(sampler) if DISTRIBUTED else sampler,
    pin_memory=torch.cuda.is_available(),
)

model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 2))
if args.resume:
    state_dict = torch.load(args.resume, map_location={"cuda:0": f"cuda:{LOCAL_RANK}"})
    # a checkpoint saved under nn.DataParallel names its keys `module.*`
    torch.nn.modules.utils.consume_prefix_in_state_dict_if_present(
        state_dict, "module."
    )
    model.load_state_dict(state_dict)
model.to(device)
# trained through DDP when distributed: gradients are averaged in backward()
ddp_model = model
if DISTRIBUTED:
    ddp_model = DDP(
        model, device_ids=[LOCAL_RANK] if next(model.parameters()).is_cuda else None
    )
criterion = nn.CrossEntropyLoss()
optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)

# Same model and data on every process so far; from here each draws its own random
# numbers (noise, dropout, augmentation), as the GPUs of one big batch would.
if DISTRIBUTED:
    torch.manual_seed(torch.initial_seed() + RANK)
for epoch in range(args.epochs):
    minority = 0
    for x, y in train_loader:
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        optimizer.zero_grad()
        loss = criterion(ddp_model(x), y)
        loss.backward()
        optimizer.step()
        minority += int(y.sum())
    if RANK == 0:
        print(f"epoch {epoch}: loss {loss.item():.4f}, class-1 samples {minority}")

if RANK == 0:
    torch.save(model.state_dict(), args.save)

if DISTRIBUTED:
    # free the models first: left to the exit, they can abort the process
    del ddp_model
    gc.collect()
    dist.destroy_process_group()
