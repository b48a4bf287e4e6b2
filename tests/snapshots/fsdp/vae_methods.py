"""A VAE trained through `model(x)` whose evaluation calls its other methods: it encodes
a batch with `model.encode(x)` and decodes samples of the prior with `model.decode(z)`
(the shape of pytorch/examples' vae, as tiny MLPs)."""
import gc
import os
import warnings

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.fsdp import fully_shard, register_fsdp_forward_method
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
g = torch.Generator().manual_seed(3)
data = torch.sigmoid(torch.randn(256, 2, generator=g) @ torch.randn(2, 16, generator=g))
dataset = TensorDataset(data)
sampler = DistributedSampler(dataset, shuffle=True) if DISTRIBUTED else None
loader = DataLoader(
    dataset,
    batch_size=per_process_batch_size(32),
    shuffle=sampler is None,
    sampler=sampler,
)


class VAE(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = nn.Linear(16, 8)
        self.mu = nn.Linear(8, 2)
        self.logvar = nn.Linear(8, 2)
        self.decoder = nn.Sequential(nn.Linear(2, 8), nn.ReLU(), nn.Linear(8, 16))

    def encode(self, x):
        h = F.relu(self.encoder(x))
        return self.mu(h), self.logvar(h)

    def decode(self, z):
        return torch.sigmoid(self.decoder(z))

    def forward(self, x):
        mu, logvar = self.encode(x)
        z = mu + torch.randn_like(mu) * torch.exp(0.5 * logvar)
        return self.decode(z), mu, logvar


model = VAE()
# sharded with FSDP2 when distributed: each process keeps a share of the
# parameters, gradients and optimizer state
if DISTRIBUTED:
    shard_model(model)
    # encode() and decode() gather the parameters too, as forward() does
    register_fsdp_forward_method(model, "encode")
    register_fsdp_forward_method(model, "decode")
optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)

# Same model and data on every process so far; from here each draws its own random
# numbers (noise, dropout, augmentation), as the GPUs of one big batch would.
if DISTRIBUTED:
    torch.manual_seed(torch.initial_seed() + RANK)
for epoch in range(3):
    if DISTRIBUTED:
        loader.sampler.set_epoch(epoch)
    for (x,) in loader:
        recon, mu, logvar = model(x)
        kld = -0.5 * torch.mean(1 + logvar - mu.pow(2) - logvar.exp())
        loss = F.binary_cross_entropy(recon, x) + kld
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    with torch.no_grad():
        codes, _ = model.encode(data[:4])
        sample = model.decode(torch.randn(4, 2))
    if RANK == 0:
        print(
            f"epoch {epoch}: loss {loss.item():.4f}, code {codes.norm():.4f}, sample {sample.mean():.4f}"
        )

if DISTRIBUTED:
    # free the models first: left to the exit, they can abort the process
    del model, optimizer
    gc.collect()
    dist.destroy_process_group()
