"""An MLP trained with gradient clipping, saving a checkpoint (model and optimizer) every
epoch and reloading it: at the start with `--resume`, and at the end to evaluate the best
epoch's weights (fsdp fixture). Trains in about a second on a CPU.
"""
import argparse
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
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
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


def full_optimizer_state_dict(model, optimizer):
    """`optimizer.state_dict()`, whole (keyed by parameter names under FSDP): every
    process must call this, and rank 0 gets the tensors on its CPU."""
    if isinstance(model, FSDPModule):
        model.reshard()  # an evaluation may have left it gathered
        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        return get_optimizer_state_dict(model, optimizer, options=options)
    return optimizer.state_dict()


def full_state_dict(model):
    """`model.state_dict()`, whole: under FSDP every process must call this, and rank 0
    gets the tensors on its CPU (the other processes get {})."""
    if isinstance(model, FSDPModule):
        model.reshard()  # an evaluation may have left it gathered
        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        return get_model_state_dict(model, options=options)
    return model.state_dict()


def load_full_optimizer_state_dict(model, optimizer, state_dict):
    """`optimizer.load_state_dict(state_dict)`; under FSDP every process must call this,
    and rank 0's `state_dict` is the one loaded."""
    if isinstance(model, FSDPModule):
        model.reshard()  # an evaluation may have left it gathered
        options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
        set_optimizer_state_dict(model, optimizer, state_dict, options=options)
    else:
        optimizer.load_state_dict(state_dict)


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


CHECKPOINT = "clip_resume.pt"


def regression_set(n, seed):
    generator = torch.Generator().manual_seed(seed)
    inputs = torch.randn(n, 8, generator=generator)
    targets = torch.sin(inputs[:, :2].sum(dim=1, keepdim=True)) + 0.1 * inputs[:, 2:3]
    return TensorDataset(inputs, targets)


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList(nn.Linear(8 if i == 0 else 32, 32) for i in range(3))
        self.out = nn.Linear(32, 1)

    def forward(self, x):
        for block in self.blocks:
            x = F.relu(block(x))
        return self.out(x)


def save_checkpoint(model, optimizer, epoch, loss):
    model_state = full_state_dict(model)
    optimizer_state = full_optimizer_state_dict(model, optimizer)
    if RANK == 0:
        torch.save(
            {
                "model": model_state,
                "optimizer": optimizer_state,
                "epoch": epoch,
                "loss": loss,
            },
            CHECKPOINT,
        )


def evaluate(model, loader):
    model.eval()
    total, count = 0.0, 0
    with torch.no_grad():
        for inputs, targets in loader:
            total += F.mse_loss(model(inputs), targets, reduction="sum").item()
            count += len(inputs)
    return total / count


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--resume", action="store_true")
    args = parser.parse_args()

    torch.manual_seed(0)
    train_dataset = regression_set(128, seed=1)
    train_sampler = (
        DistributedSampler(train_dataset, shuffle=True) if DISTRIBUTED else None
    )
    train_loader = DataLoader(
        train_dataset,
        batch_size=per_process_batch_size(16),
        shuffle=train_sampler is None,
        sampler=train_sampler,
    )
    val_loader = DataLoader(regression_set(32, seed=2), batch_size=16)

    model = MLP()
    # sharded with FSDP2 when distributed: each process keeps a share of the
    # parameters, gradients and optimizer state
    if DISTRIBUTED:
        shard_model(model)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    start = 0
    if args.resume and os.path.exists(CHECKPOINT):
        checkpoint = torch.load(
            CHECKPOINT, map_location={"cuda:0": f"cuda:{LOCAL_RANK}"}
        )
        load_full_state_dict(model, checkpoint["model"])
        load_full_optimizer_state_dict(model, optimizer, checkpoint["optimizer"])
        start = checkpoint["epoch"] + 1

    best = float("inf")
    # Same model and data on every process so far; from here each draws its own random
    # numbers (noise, dropout, augmentation), as the GPUs of one big batch would.
    if DISTRIBUTED:
        torch.manual_seed(torch.initial_seed() + RANK)
    for epoch in range(start, start + args.epochs):
        if DISTRIBUTED:
            train_loader.sampler.set_epoch(epoch)
        model.train()
        for inputs, targets in train_loader:
            loss = F.mse_loss(model(inputs), targets)
            optimizer.zero_grad()
            loss.backward()
            norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
            optimizer.step()
        val_loss = evaluate(model, val_loader)
        if RANK == 0:
            print(
                f"epoch {epoch}: loss {loss.item():.4f} grad norm {norm.item():.3f} val {val_loss:.4f}"
            )
        if first_process_decides(val_loss < best):
            best = val_loss
            save_checkpoint(model, optimizer, epoch, val_loss)

    if DISTRIBUTED:
        dist.barrier()  # rank 0 may still be writing it
    load_full_state_dict(
        model,
        torch.load(CHECKPOINT, map_location={"cuda:0": f"cuda:{LOCAL_RANK}"})["model"],
    )
    evaluate_result = evaluate(model, val_loader)
    if RANK == 0:
        print(f"best val {evaluate_result:.4f}")


if __name__ == "__main__":
    main()

    if DISTRIBUTED:
        # free the models first: left to the exit, they can abort the process
        gc.collect()
        dist.destroy_process_group()
