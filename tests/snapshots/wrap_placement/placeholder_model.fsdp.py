"""A trainer whose `__init__` sets the model to a `None` placeholder, then builds the
real one in `build_model()` with its optimizer, and moves it to the device there.

`--to ddp` wraps the model where `build_model()` has built and moved it (not after the
placeholder, where it has no parameters yet). Unshuffled, no dropout, SGD on mean losses:
two processes average to the one-process run."""
import argparse
import gc
import os
import warnings

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.fsdp import fully_shard
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

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


def shard_model(model):
    """FSDP2: each process keeps 1/WORLD_SIZE of the parameters, gradients and optimizer
    state. Each repeated block (a child of the outermost ModuleLists and Sequentials,
    e.g. transformer layers) gathers its parameters only while it computes; the root
    holds the rest. Every process starts from rank 0's values, as under DDP (a model
    built after a per-process seed would otherwise start from a different draw)."""
    if torch.distributed.is_initialized():
        for tensor in [*model.parameters(), *model.buffers()]:
            torch.distributed.broadcast(tensor.data, src=0)
    policies = {}
    containers = [model]
    while containers:
        module = containers.pop()
        if isinstance(module, (torch.nn.ModuleList, torch.nn.Sequential)):
            for block in module:
                if any(True for _ in block.parameters()):
                    fully_shard(block, **policies)
        else:
            containers.extend(module.children())
    fully_shard(model, **policies)


class Trainer:
    def __init__(self, arch, loader, epochs):
        self.loader = loader
        self.model = None
        self.optimizer = None
        self.arch = arch
        self.epochs = epochs
        self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        self.build_model()

    def build_model(self):
        if self.arch == "wide":
            self.model = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 1))
        else:
            self.model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
        self.model.to(self.device)
        # sharded with FSDP2 when distributed: each process keeps a share of the
        # parameters, gradients and optimizer state
        if DISTRIBUTED:
            shard_model(self.model)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.05)

    def train(self):
        for epoch in range(self.epochs):
            if DISTRIBUTED:
                self.loader.sampler.set_epoch(epoch)
            for x, y in self.loader:
                x, y = x.to(self.device, non_blocking=True), y.to(
                    self.device, non_blocking=True
                )
                loss = F.mse_loss(self.model(x), y)
                self.optimizer.zero_grad()
                loss.backward()
                self.optimizer.step()
            if RANK == 0:
                print(f"epoch {epoch}: loss {loss.item():.4f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--arch", default="narrow")
    parser.add_argument("--epochs", type=int, default=2)
    args = parser.parse_args()
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    X = torch.randn(128, 8, generator=g)
    dataset = TensorDataset(X, X.sum(dim=1, keepdim=True))
    sampler = DistributedSampler(dataset, shuffle=False) if DISTRIBUTED else None
    loader = DataLoader(
        dataset,
        batch_size=per_process_batch_size(32),
        pin_memory=torch.cuda.is_available(),
        sampler=sampler,
    )
    trainer = Trainer(args.arch, loader, args.epochs)
    # Same model and data on every process so far; from here each draws its own random
    # numbers (noise, dropout, augmentation), as the GPUs of one big batch would.
    if DISTRIBUTED:
        torch.manual_seed(torch.initial_seed() + RANK)
    trainer.train()

    if DISTRIBUTED:
        # free the models first: left to the exit, they can abort the process
        del trainer
        gc.collect()
        dist.destroy_process_group()
