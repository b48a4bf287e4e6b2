"""Captioning-style training: an encoder whose fine-tuning is switched off (every
parameter `requires_grad=False`, its optimizer `None`) feeds a decoder that trains.

`--to ddp` must not wrap the frozen encoder: `DistributedDataParallel` raises for a
module without a parameter that requires a gradient. Unshuffled, no dropout, SGD on mean
losses: two processes average to the one-process run."""
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


FINE_TUNE_ENCODER = False


class Encoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(8, 16), nn.Tanh())

    def fine_tune(self, on):
        for p in self.body.parameters():
            p.requires_grad = on

    def forward(self, x):
        return self.body(x)


def main():
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(3)
    X = torch.randn(128, 8, generator=g)
    y = X.sum(dim=1, keepdim=True)
    dataset = TensorDataset(X, y)
    sampler = DistributedSampler(dataset, shuffle=False) if DISTRIBUTED else None
    loader = DataLoader(dataset, batch_size=per_process_batch_size(32), sampler=sampler)

    encoder = Encoder()
    encoder.fine_tune(FINE_TUNE_ENCODER)
    # sharded with FSDP2 when distributed: each process keeps a share of the
    # parameters, gradients and optimizer state
    if DISTRIBUTED:
        shard_model(encoder)
    decoder = nn.Linear(16, 1)
    # sharded with FSDP2 when distributed: each process keeps a share of the
    # parameters, gradients and optimizer state
    if DISTRIBUTED:
        shard_model(decoder)
    encoder_optimizer = (
        torch.optim.SGD(encoder.parameters(), lr=0.05) if FINE_TUNE_ENCODER else None
    )
    decoder_optimizer = torch.optim.SGD(decoder.parameters(), lr=0.05)
    # Same model and data on every process so far; from here each draws its own random
    # numbers (noise, dropout, augmentation), as the GPUs of one big batch would.
    if DISTRIBUTED:
        torch.manual_seed(torch.initial_seed() + RANK)
    for epoch in range(2):
        if DISTRIBUTED:
            loader.sampler.set_epoch(epoch)
        for x, target in loader:
            loss = F.mse_loss(decoder(encoder(x)), target)
            decoder_optimizer.zero_grad()
            if encoder_optimizer is not None:
                encoder_optimizer.zero_grad()
            loss.backward()
            decoder_optimizer.step()
            if encoder_optimizer is not None:
                encoder_optimizer.step()
        if RANK == 0:
            print(f"epoch {epoch}: loss {loss.item():.4f}")


if __name__ == "__main__":
    main()

    if DISTRIBUTED:
        # free the models first: left to the exit, they can abort the process
        gc.collect()
        dist.destroy_process_group()
