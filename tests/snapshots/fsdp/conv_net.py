"""A small conv net (an `nn.Sequential`) on synthetic 12x12 images (fsdp fixture).

The class of an image is the quadrant where its bright square sits. Trains in about a
second on a CPU.
"""
import gc
import os
import warnings

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
)
from torch.distributed.fsdp import fully_shard
from torch.distributed.fsdp import FSDPModule
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


def full_state_dict(model):
    """`model.state_dict()`, whole: under FSDP every process must call this, and rank 0
    gets the tensors on its CPU (the other processes get {})."""
    if isinstance(model, FSDPModule):
        model.reshard()  # an evaluation may have left it gathered
        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        return get_model_state_dict(model, options=options)
    return model.state_dict()


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


torch.backends.cudnn.benchmark = True


def squares(n, seed):
    generator = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 4, (n,), generator=generator)
    images = torch.randn(n, 1, 12, 12, generator=generator) * 0.3
    for image, label in zip(images, labels.tolist()):
        row, col = 6 * (label // 2), 6 * (label % 2)
        image[0, row + 1: row + 5, col + 1: col + 5] += 1.0
    return TensorDataset(images, labels)


def main():
    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    train_dataset = squares(128, seed=1)
    train_sampler = (
        DistributedSampler(train_dataset, shuffle=True) if DISTRIBUTED else None
    )
    train_loader = DataLoader(
        train_dataset,
        batch_size=per_process_batch_size(16),
        shuffle=train_sampler is None,
        pin_memory=torch.cuda.is_available(),
        sampler=train_sampler,
    )

    model = nn.Sequential(
        nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(16 * 3 * 3, 4),
    ).to(device)
    # sharded with FSDP2 when distributed: each process keeps a share of the
    # parameters, gradients and optimizer state
    if DISTRIBUTED:
        shard_model(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

    # Same model and data on every process so far; from here each draws its own random
    # numbers (noise, dropout, augmentation), as the GPUs of one big batch would.
    if DISTRIBUTED:
        torch.manual_seed(torch.initial_seed() + RANK)
    for epoch in range(2):
        if DISTRIBUTED:
            train_loader.sampler.set_epoch(epoch)
        for images, labels in train_loader:
            images, labels = images.to(device, non_blocking=True), labels.to(
                device, non_blocking=True
            )
            loss = F.cross_entropy(model(images), labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        if RANK == 0:
            print(f"epoch {epoch}: loss {loss.item():.4f}")

    model_state = full_state_dict(model)
    if RANK == 0:
        torch.save(model_state, "conv_net.pt")


if __name__ == "__main__":
    main()

    if DISTRIBUTED:
        # free the models first: left to the exit, they can abort the process
        gc.collect()
        dist.destroy_process_group()
