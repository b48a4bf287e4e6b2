"""A Trainer that builds its optimizer with the model's own `configure_optimizers()` when it
runs (minGPT's shape). Under FSDP that method must not be registered as a forward method:
registered, it gathered the parameters and gave AdamW the whole ones, which FSDP freed after
the call; the blocks never trained, and the proof crashed reading them."""
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


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Linear(8, 32)
        self.blocks = nn.ModuleList([nn.Linear(32, 32) for _ in range(2)])
        self.head = nn.Linear(32, 1)

    def forward(self, x):
        x = self.embed(x)
        for block in self.blocks:
            x = x + torch.tanh(block(x))
        return self.head(x)

    def configure_optimizers(self):
        decay = [p for n, p in self.named_parameters() if n.endswith("weight")]
        no_decay = [p for n, p in self.named_parameters() if n.endswith("bias")]
        groups = [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}]
        return torch.optim.AdamW(groups, lr=1e-3)


class Trainer:
    def __init__(self, model, dataset, epochs=2):
        self.model = model
        # sharded with FSDP2 when distributed: each process keeps a share of the
        # parameters, gradients and optimizer state
        if DISTRIBUTED:
            shard_model(self.model)
        self.dataset = dataset
        self.epochs = epochs

    def run(self):
        self.optimizer = self.model.configure_optimizers()
        sampler = (
            DistributedSampler(self.dataset, shuffle=True) if DISTRIBUTED else None
        )
        loader = DataLoader(
            self.dataset,
            batch_size=per_process_batch_size(8),
            shuffle=sampler is None,
            sampler=sampler,
        )
        for epoch in range(self.epochs):
            if DISTRIBUTED:
                loader.sampler.set_epoch(epoch)
            for x, y in loader:
                self.model.zero_grad(set_to_none=True)
                loss = nn.functional.mse_loss(self.model(x), y)
                loss.backward()
                self.optimizer.step()
            if RANK == 0:
                print(f"epoch {epoch} loss {loss.item():.4f}")


if __name__ == "__main__":
    torch.manual_seed(0)
    model = Net()
    data = TensorDataset(torch.randn(64, 8), torch.randn(64, 1))
    trainer = Trainer(model, data)
    # Same model and data on every process so far; from here each draws its own random
    # numbers (noise, dropout, augmentation), as the GPUs of one big batch would.
    if DISTRIBUTED:
        torch.manual_seed(torch.initial_seed() + RANK)
    trainer.run()

    if DISTRIBUTED:
        # free the models first: left to the exit, they can abort the process
        del model, trainer
        gc.collect()
        dist.destroy_process_group()
