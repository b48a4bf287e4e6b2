"""Checkpoints written inside `with open(path, "wb") as f:` (VQ-VAE's shape): the block
goes on rank 0 whole, so under FSDP the gathering of the state dict, which every process
must run, goes before it (before, refused: "this runs the sharded model (or gathers its
state) on some processes only"); the best-loss test, which each process computes from its
own batches, is decided by rank 0."""
import gc
import os
import warnings

import torch
import torch.distributed as dist
import torch.nn as nn
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
    dist.init_process_group("gloo", init_method="env://")


def full_state_dict(model):
    """`model.state_dict()`, whole: under FSDP every process must call this, and rank 0
    gets the tensors on its CPU (the other processes get {})."""
    if isinstance(model, FSDPModule):
        model.reshard()  # an evaluation may have left it gathered
        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        return get_model_state_dict(model, options=options)
    return model.state_dict()


def first_process_decides(condition):
    """Whether `condition` holds on rank 0: every process takes the branch rank 0 takes."""
    if not DISTRIBUTED:
        return condition
    flag = torch.tensor(float(bool(condition)))
    dist.broadcast(flag, src=0)
    return bool(flag.item())


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


torch.manual_seed(0)
dataset = TensorDataset(torch.randn(64, 8), torch.randn(64, 1))
sampler = DistributedSampler(dataset, shuffle=True) if DISTRIBUTED else None
loader = DataLoader(
    dataset,
    batch_size=per_process_batch_size(16),
    shuffle=sampler is None,
    sampler=sampler,
)
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
# sharded with FSDP2 when distributed: each process keeps a share of the
# parameters, gradients and optimizer state
if DISTRIBUTED:
    shard_model(model)
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
best_loss = -1.0
# Same model and data on every process so far; from here each draws its own random
# numbers (noise, dropout, augmentation), as the GPUs of one big batch would.
if DISTRIBUTED:
    torch.manual_seed(torch.initial_seed() + RANK)
for epoch in range(2):
    if DISTRIBUTED:
        loader.sampler.set_epoch(epoch)
    for x, y in loader:
        loss = nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    if first_process_decides(epoch == 0 or loss.item() < best_loss):
        best_loss = loss.item()
        model_state = full_state_dict(model)
        if RANK == 0:
            with open("best.pt", "wb") as f:
                torch.save(model_state, f)
    model_state = full_state_dict(model)
    if RANK == 0:
        with open("model_{0}.pt".format(epoch + 1), "wb") as f:
            torch.save(model_state, f)

if DISTRIBUTED:
    # free the models first: left to the exit, they can abort the process
    del model, optimizer
    gc.collect()
    dist.destroy_process_group()
