"""A Solver class whose `save()` writes the model's state dict and says so (a CIFAR
classifier template's shape). Under FSDP every process must gather the state, so `save()`
keeps running on every process and only its writes go on rank 0 (before, it returned early
on the others and the gathering after that return was refused; its name, shared with
`torch.save`, also made every `torch.save(...)` look like a call of it)."""
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


class Solver:
    def __init__(self):
        torch.manual_seed(0)
        self.model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
        # sharded with FSDP2 when distributed: each process keeps a share of the
        # parameters, gradients and optimizer state
        if DISTRIBUTED:
            shard_model(self.model)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=1e-3)
        data = TensorDataset(torch.randn(64, 8), torch.randn(64, 1))
        sampler = DistributedSampler(data, shuffle=True) if DISTRIBUTED else None
        self.loader = DataLoader(
            data,
            batch_size=per_process_batch_size(8),
            shuffle=sampler is None,
            sampler=sampler,
        )

    def train(self):
        for x, y in self.loader:
            self.optimizer.zero_grad()
            loss = nn.functional.mse_loss(self.model(x), y)
            loss.backward()
            self.optimizer.step()
        return loss.item()

    def save(self):
        model_state = full_state_dict(self.model)
        if RANK == 0:
            torch.save(model_state, "model.pth")
            print("saved")

    def run(self):
        for epoch in range(2):
            if DISTRIBUTED:
                self.loader.sampler.set_epoch(epoch)
            train_result = self.train()
            if RANK == 0:
                print(f"epoch {epoch} loss {train_result:.4f}")
        self.save()


if __name__ == "__main__":
    Solver().run()

    if DISTRIBUTED:
        # free the models first: left to the exit, they can abort the process
        gc.collect()
        dist.destroy_process_group()
