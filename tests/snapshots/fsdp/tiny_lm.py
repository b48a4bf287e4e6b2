"""A tiny transformer language model on a synthetic token stream (fsdp fixture).

The layers sit in an `nn.ModuleList`; the optimizer is built before the model moves to
its device, so `--to fsdp` must build it after sharding. Trains in about a second on a CPU.
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


VOCAB, CONTEXT, WIDTH, HEADS, LAYERS = 32, 16, 32, 4, 2


def token_windows(n_windows, seed):
    """Windows of a walk where each token is mostly followed by (token * 3 + 1) % VOCAB."""
    generator = torch.Generator().manual_seed(seed)
    tokens = [0]
    for noise in torch.rand(n_windows * CONTEXT, generator=generator).tolist():
        tokens.append((tokens[-1] * 3 + 1) % VOCAB if noise < 0.8 else int(noise * 100) % VOCAB)
    stream = torch.tensor(tokens)
    windows = stream[: n_windows * CONTEXT].view(n_windows, CONTEXT)
    targets = stream[1: n_windows * CONTEXT + 1].view(n_windows, CONTEXT)
    return TensorDataset(windows, targets)


class Layer(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm1 = nn.LayerNorm(WIDTH)
        self.attn = nn.MultiheadAttention(WIDTH, HEADS, batch_first=True)
        self.norm2 = nn.LayerNorm(WIDTH)
        self.mlp = nn.Sequential(nn.Linear(WIDTH, 4 * WIDTH), nn.GELU(), nn.Linear(4 * WIDTH, WIDTH))

    def forward(self, x, mask):
        h = self.norm1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.norm2(x))


class TinyLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.position = nn.Parameter(torch.zeros(CONTEXT, WIDTH))
        self.layers = nn.ModuleList(Layer() for _ in range(LAYERS))
        self.head = nn.Linear(WIDTH, VOCAB)

    def forward(self, tokens):
        mask = torch.triu(torch.ones(CONTEXT, CONTEXT, dtype=torch.bool), diagonal=1).to(tokens.device)
        x = self.embed(tokens) + self.position
        for layer in self.layers:
            x = layer(x, mask)
        return self.head(x)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=2)
    args = parser.parse_args()

    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dataset = token_windows(64, seed=1)
    sampler = DistributedSampler(dataset, shuffle=True) if DISTRIBUTED else None
    loader = DataLoader(
        dataset,
        batch_size=per_process_batch_size(16),
        shuffle=sampler is None,
        pin_memory=torch.cuda.is_available(),
        sampler=sampler,
    )

    model = TinyLM()
    model.to(device)
    # sharded with FSDP2 when distributed: each process keeps a share of the
    # parameters, gradients and optimizer state
    if DISTRIBUTED:
        shard_model(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)

    # Same model and data on every process so far; from here each draws its own random
    # numbers (noise, dropout, augmentation), as the GPUs of one big batch would.
    if DISTRIBUTED:
        torch.manual_seed(torch.initial_seed() + RANK)
    for epoch in range(args.epochs):
        if DISTRIBUTED:
            loader.sampler.set_epoch(epoch)
        model.train()
        for tokens, targets in loader:
            tokens, targets = tokens.to(device, non_blocking=True), targets.to(
                device, non_blocking=True
            )
            logits = model(tokens)
            loss = F.cross_entropy(logits.view(-1, VOCAB), targets.view(-1))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        if RANK == 0:
            print(f"epoch {epoch}: loss {loss.item():.4f}")

    model_state = full_state_dict(model)
    if RANK == 0:
        torch.save(model_state, "tiny_lm.pt")


if __name__ == "__main__":
    main()

    if DISTRIBUTED:
        # free the models first: left to the exit, they can abort the process
        gc.collect()
        dist.destroy_process_group()
