"""A trainer class whose `train()` draws its batches with `next()` from the loader and
whose `test()` loops over the same loader under `torch.no_grad()` (a GAN repository's
solver, written anew). The loader comes from data.py, built without `pin_memory`. The
conversion pins it there (ACC102, as it feeds training), so the evaluation copy
`x.to(self.device)` here reads page-locked batches too and gets `non_blocking=True` in
the same conversion; before, only a second conversion added it, and the check that a
second conversion changes nothing refused the result."""
import gc
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

from data import get_loader

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


def whole(loader):
    """All of a training loader's data, where its sampler gives this process a shard: an
    evaluation over it sees the whole set on every process. Another loader, as it is."""
    if not isinstance(loader.sampler, torch.utils.data.DistributedSampler):
        return loader
    return torch.utils.data.DataLoader(
        loader.dataset,
        batch_size=loader.batch_size * WORLD_SIZE,
        num_workers=loader.num_workers,
        collate_fn=loader.collate_fn,
        pin_memory=loader.pin_memory,
        drop_last=loader.drop_last,
    )


class Solver:
    def __init__(self, loader, steps):
        self.loader = loader
        self.steps = steps
        self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        self.net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1)).to(self.device)
        # trained through DDP when distributed: gradients are averaged in backward()
        self.ddp_net = self.net
        if DISTRIBUTED:
            self.ddp_net = DDP(
                self.net,
                device_ids=(
                    [LOCAL_RANK] if next(self.net.parameters()).is_cuda else None
                ),
            )
        self.optimizer = torch.optim.SGD(self.net.parameters(), lr=0.05)

    def train(self):
        data_iter = iter(self.loader)
        for step in range(self.steps):
            try:
                x, y = next(data_iter)
            except StopIteration:
                if DISTRIBUTED:
                    # a new pass over the data: a new shuffle
                    self.loader.sampler.set_epoch(self.loader.sampler.epoch + 1)
                data_iter = iter(self.loader)
                x, y = next(data_iter)
            x = x.to(self.device)
            y = y.to(self.device)
            loss = nn.functional.mse_loss(self.ddp_net(x), y)
            self.optimizer.zero_grad()
            loss.backward()
            self.optimizer.step()
            if step % 10 == 0:
                if RANK == 0:
                    print(f"step {step} loss {loss.item():.4f}")

    def test(self):
        total = 0.0
        with torch.no_grad():
            for i, (x, y) in enumerate(whole(self.loader)):
                x = x.to(self.device, non_blocking=True)
                total += nn.functional.mse_loss(self.net(x).cpu(), y).item()
        if RANK == 0:
            print(f"test loss {total / len(self.loader):.4f}")


if __name__ == "__main__":
    torch.manual_seed(0)
    solver = Solver(get_loader(), steps=30)
    # Same model and data on every process so far; from here each draws its own random
    # numbers (noise, dropout, augmentation), as the GPUs of one big batch would.
    if DISTRIBUTED:
        torch.manual_seed(torch.initial_seed() + RANK)
    solver.train()
    solver.test()

    if DISTRIBUTED:
        # free the models first: left to the exit, they can abort the process
        del solver
        gc.collect()
        dist.destroy_process_group()
