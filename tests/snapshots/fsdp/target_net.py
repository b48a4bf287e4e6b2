"""A value regression against a target network refreshed from the trained one every few
steps, a DQN's shape on synthetic data (fsdp fixture). Trains in about a second on a CPU.

Both networks are built in one statement and both are sharded, in one block. The
refresh, `target.load_state_dict(model.state_dict())`, gathers the model's whole state
dict first (every process takes part) and loads rank 0's into the target's shards.
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
    set_model_state_dict,
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


def load_full_state_dict(model, state_dict, strict=True):
    """`model.load_state_dict(state_dict)` of a whole state dict; under FSDP every
    process must call this, and rank 0's `state_dict` is the one loaded."""
    if isinstance(model, FSDPModule):
        model.reshard()  # an evaluation may have left it gathered
        options = StateDictOptions(
            full_state_dict=True, broadcast_from_rank0=True, strict=strict
        )
        return set_model_state_dict(model, state_dict, options=options)
    return model.load_state_dict(state_dict, strict=strict)


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


def transitions(n, seed):
    generator = torch.Generator().manual_seed(seed)
    states = torch.randn(n, 6, generator=generator)
    rewards = states[:, :2].sum(dim=1, keepdim=True)
    next_states = states.roll(1, dims=1)
    return TensorDataset(states, rewards, next_states)


def main():
    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dataset = transitions(256, seed=1)
    sampler = DistributedSampler(dataset, shuffle=False) if DISTRIBUTED else None
    loader = DataLoader(
        dataset,
        batch_size=per_process_batch_size(32),
        pin_memory=torch.cuda.is_available(),
        sampler=sampler,
    )
    model, target = nn.Linear(6, 1).to(device), nn.Linear(6, 1).to(device)
    # sharded with FSDP2 when distributed: each process keeps a share of the
    # parameters, gradients and optimizer state
    if DISTRIBUTED:
        shard_model(model)
        shard_model(target)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    # Same model and data on every process so far; from here each draws its own random
    # numbers (noise, dropout, augmentation), as the GPUs of one big batch would.
    if DISTRIBUTED:
        torch.manual_seed(torch.initial_seed() + RANK)
    for epoch in range(2):
        if DISTRIBUTED:
            loader.sampler.set_epoch(epoch)
        for step, (states, rewards, next_states) in enumerate(loader):
            if step % 4 == 0:
                model_state = full_state_dict(model)
                load_full_state_dict(target, model_state)
            states, rewards = states.to(device, non_blocking=True), rewards.to(
                device, non_blocking=True
            )
            expected = (
                rewards
                + 0.5 * target(next_states.to(device, non_blocking=True)).detach()
            )
            loss = F.mse_loss(model(states), expected)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    model_state = full_state_dict(model)
    if RANK == 0:
        torch.save(model_state, "target_net.pt")


if __name__ == "__main__":
    main()

    if DISTRIBUTED:
        # free the models first: left to the exit, they can abort the process
        gc.collect()
        dist.destroy_process_group()
