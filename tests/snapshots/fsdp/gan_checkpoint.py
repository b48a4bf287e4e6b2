"""A GAN that checkpoints both models and both optimizers in one dict (pytorch DCGAN
scripts' shape). Under FSDP each optimizer's state is gathered with the model it trains,
`full_optimizer_state_dict(netG, optimizerG)`: the program's values say which (before,
"which sharded model `optimizerG` optimizes is not known here" refused it)."""
import gc
import os
import warnings

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
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
dataset = TensorDataset(torch.randn(64, 8))
sampler = DistributedSampler(dataset, shuffle=True) if DISTRIBUTED else None
loader = DataLoader(
    dataset,
    batch_size=per_process_batch_size(16),
    shuffle=sampler is None,
    sampler=sampler,
)
netG = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 8))
# sharded with FSDP2 when distributed: each process keeps a share of the
# parameters, gradients and optimizer state
if DISTRIBUTED:
    shard_model(netG)
netD = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
# sharded with FSDP2 when distributed: each process keeps a share of the
# parameters, gradients and optimizer state
if DISTRIBUTED:
    shard_model(netD)
optimizerG = torch.optim.Adam(netG.parameters(), lr=1e-3)
optimizerD = torch.optim.Adam(netD.parameters(), lr=1e-3)
criterion = nn.BCEWithLogitsLoss()
# Same model and data on every process so far; from here each draws its own random
# numbers (noise, dropout, augmentation), as the GPUs of one big batch would.
if DISTRIBUTED:
    torch.manual_seed(torch.initial_seed() + RANK)
for epoch in range(2):
    if DISTRIBUTED:
        loader.sampler.set_epoch(epoch)
    for (x,) in loader:
        z = torch.randn(x.size(0), 4)
        optimizerD.zero_grad()
        d_loss = criterion(netD(x), torch.ones(x.size(0), 1)) + criterion(
            netD(netG(z).detach()), torch.zeros(x.size(0), 1)
        )
        d_loss.backward()
        optimizerD.step()
        optimizerG.zero_grad()
        g_loss = criterion(netD(netG(z)), torch.ones(x.size(0), 1))
        g_loss.backward()
        optimizerG.step()
    if RANK == 0:
        print(f"epoch {epoch} D {d_loss.item():.4f} G {g_loss.item():.4f}")
netG_state = full_state_dict(netG)
netD_state = full_state_dict(netD)
optimizerG_state = full_optimizer_state_dict(netG, optimizerG)
optimizerD_state = full_optimizer_state_dict(netD, optimizerD)
if RANK == 0:
    torch.save(
        {
            "generator": netG_state,
            "discriminator": netD_state,
            "optimizerG": optimizerG_state,
            "optimizerD": optimizerD_state,
        },
        "gan.pth",
    )

if DISTRIBUTED:
    # free the models first: left to the exit, they can abort the process
    del netG, netD, optimizerG, optimizerD
    gc.collect()
    dist.destroy_process_group()
