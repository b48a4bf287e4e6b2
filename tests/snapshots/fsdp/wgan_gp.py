"""WGAN-GP on a ring of Gaussians (the shape of eriklindernoren's wgan_gp.py, as tiny
MLPs): the critic is called by the step and by the gradient-penalty helper, and trains
n_critic times per generator step."""
import gc
import os
import warnings

import torch
import torch.distributed as dist
import torch.nn as nn
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


torch.manual_seed(0)
g = torch.Generator().manual_seed(1)
angles = torch.rand(512, generator=g) * 6.2832
points = torch.stack([angles.cos(), angles.sin()], 1) + 0.05 * torch.randn(512, 2, generator=g)
dataset = TensorDataset(points)
sampler = DistributedSampler(dataset, shuffle=True) if DISTRIBUTED else None
loader = DataLoader(
    dataset,
    batch_size=per_process_batch_size(32),
    shuffle=sampler is None,
    sampler=sampler,
)

latent_dim, n_critic, lambda_gp = 4, 3, 10.0
generator = nn.Sequential(nn.Linear(latent_dim, 32), nn.ReLU(), nn.Linear(32, 2))
# sharded with FSDP2 when distributed: each process keeps a share of the
# parameters, gradients and optimizer state
if DISTRIBUTED:
    shard_model(generator)
discriminator = nn.Sequential(nn.Linear(2, 32), nn.LeakyReLU(0.2), nn.Linear(32, 1))
# sharded with FSDP2 when distributed: each process keeps a share of the
# parameters, gradients and optimizer state
if DISTRIBUTED:
    shard_model(discriminator)
optimizer_G = torch.optim.Adam(generator.parameters(), lr=1e-3, betas=(0.5, 0.9))
optimizer_D = torch.optim.Adam(discriminator.parameters(), lr=1e-3, betas=(0.5, 0.9))


def compute_gradient_penalty(D, real_samples, fake_samples):
    alpha = torch.rand(real_samples.size(0), 1)
    interpolates = (alpha * real_samples + (1 - alpha) * fake_samples).requires_grad_(True)
    d_interpolates = D(interpolates)
    gradients = torch.autograd.grad(
        outputs=d_interpolates,
        inputs=interpolates,
        grad_outputs=torch.ones_like(d_interpolates),
        create_graph=True,
    )[0]
    return ((gradients.norm(2, dim=1) - 1) ** 2).mean()


# Same model and data on every process so far; from here each draws its own random
# numbers (noise, dropout, augmentation), as the GPUs of one big batch would.
if DISTRIBUTED:
    torch.manual_seed(torch.initial_seed() + RANK)
for epoch in range(2):
    if DISTRIBUTED:
        loader.sampler.set_epoch(epoch)
    for i, (real,) in enumerate(loader):
        z = torch.randn(real.size(0), latent_dim)
        fake = generator(z)
        gradient_penalty = compute_gradient_penalty(discriminator, real, fake.detach())
        d_loss = -discriminator(real).mean() + discriminator(fake.detach()).mean() + lambda_gp * gradient_penalty
        optimizer_D.zero_grad()
        d_loss.backward()
        optimizer_D.step()

        if i % n_critic == 0:
            g_loss = -discriminator(generator(z)).mean()
            optimizer_G.zero_grad()
            g_loss.backward()
            optimizer_G.step()
    if RANK == 0:
        print(f"epoch {epoch}: d_loss {d_loss.item():.4f} g_loss {g_loss.item():.4f}")

if DISTRIBUTED:
    # free the models first: left to the exit, they can abort the process
    del generator, discriminator, optimizer_G, optimizer_D
    gc.collect()
    dist.destroy_process_group()
