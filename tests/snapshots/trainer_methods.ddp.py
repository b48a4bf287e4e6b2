"""Regression on synthetic data, trained by a Trainer whose step is spread over methods.

The shape of pytorch/examples' distributed/ddp-tutorial-series/single_gpu.py (written
anew here): `train()` loops over epochs and calls `_run_epoch(epoch)`, which loops over
the loader and calls `_run_batch(x, y)`, where the forward pass, the loss and
`backward()` are. The DataLoader is built by a helper function and the objects by
another. The maintainers' own multigpu_torchrun.py shows the expected DDP version:
the model wrapped in `Trainer.__init__`, a DistributedSampler on the loader,
`set_epoch` every epoch, the checkpoint written by rank 0 only.

Slow patterns on purpose: DataLoader without num_workers, blocking `.to()` copies.
"""
import argparse
import gc
import os
import warnings

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset
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


class NoisyLinearData(Dataset):
    """`y = x @ w + noise` for 20 features."""

    def __init__(self, size):
        generator = torch.Generator().manual_seed(0)
        self.x = torch.randn(size, 20, generator=generator)
        w = torch.randn(20, 1, generator=generator)
        self.y = self.x @ w + 0.1 * torch.randn(size, 1, generator=generator)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, index):
        return self.x[index], self.y[index]


class Trainer:
    def __init__(self, model, train_data, optimizer, device, save_every):
        self.device = device
        self.model = model.to(device)
        # trained through DDP when distributed: gradients are averaged in backward()
        self.ddp_model = self.model
        if DISTRIBUTED:
            self.ddp_model = DDP(
                self.model,
                device_ids=(
                    [LOCAL_RANK] if next(self.model.parameters()).is_cuda else None
                ),
            )
        self.train_data = train_data
        self.optimizer = optimizer
        self.save_every = save_every

    def _run_batch(self, source, targets):
        self.optimizer.zero_grad()
        output = self.ddp_model(source)
        loss = F.mse_loss(output, targets)
        loss.backward()
        self.optimizer.step()

    def _run_epoch(self, epoch):
        if RANK == 0:
            print(f"Epoch {epoch} | Steps: {len(self.train_data)}")
        for source, targets in self.train_data:
            source = source.to(self.device, non_blocking=True)
            targets = targets.to(self.device, non_blocking=True)
            self._run_batch(source, targets)

    def _save_checkpoint(self, epoch):
        if RANK != 0:
            return  # only rank 0 writes
        torch.save(self.model.state_dict(), "trainer_methods.pt")
        print(f"Epoch {epoch} | checkpoint saved")

    def train(self, max_epochs):
        for epoch in range(max_epochs):
            if DISTRIBUTED:
                self.train_data.sampler.set_epoch(epoch)
            self._run_epoch(epoch)
            if epoch % self.save_every == 0:
                self._save_checkpoint(epoch)


def load_train_objs():
    train_set = NoisyLinearData(256)
    model = torch.nn.Sequential(torch.nn.Linear(20, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    return train_set, model, optimizer


def prepare_dataloader(dataset, batch_size):
    sampler = DistributedSampler(dataset, shuffle=True) if DISTRIBUTED else None
    return DataLoader(
        dataset,
        batch_size=per_process_batch_size(batch_size),
        shuffle=sampler is None,
        pin_memory=torch.cuda.is_available(),
        sampler=sampler,
    )


def main(device, total_epochs, save_every, batch_size):
    torch.manual_seed(0)
    dataset, model, optimizer = load_train_objs()
    train_data = prepare_dataloader(dataset, batch_size)
    trainer = Trainer(model, train_data, optimizer, device, save_every)
    # Same model and data on every process so far; from here each draws its own random
    # numbers (noise, dropout, augmentation), as the GPUs of one big batch would.
    if DISTRIBUTED:
        torch.manual_seed(torch.initial_seed() + RANK)
    trainer.train(total_epochs)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="Trainer with a step spread over methods")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--save-every", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=32)
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    main(device, args.epochs, args.save_every, args.batch_size)

    if DISTRIBUTED:
        # free the models first: left to the exit, they can abort the process
        gc.collect()
        dist.destroy_process_group()
