"""Classifier on synthetic clusters, trained through helper functions.

The training step is a function (`train_step`) called from the loader loop of
`train_epoch`; the loaders come from `make_loaders()`; the loss is a module of the
script's own (`FocalLoss`, an `nn.Module` with no parameters); the model is evaluated
once before training starts, through another loader loop. Each is a shape a converter
must follow through calls: the training loader (not the validation one) is sharded,
the model (not the loss) trains through DDP, and `set_epoch` goes where the epoch loop
runs the training function.

Slow patterns on purpose: DataLoader without num_workers, blocking `.to()` copies,
evaluation without `torch.no_grad()`.
"""
import argparse
import gc
import os
import warnings

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
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


def all_reduce_sums(*sums):
    """The sums over every process of `sums` (each process summed its share of a set)."""
    totals = torch.tensor(sums, dtype=torch.float64)
    dist.all_reduce(totals)
    return [type(value)(total) for value, total in zip(sums, totals.tolist())]


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


class FocalLoss(nn.Module):
    """Cross-entropy that weighs down the examples the model already gets right."""

    def __init__(self, gamma=2.0):
        super().__init__()
        self.gamma = gamma

    def forward(self, logits, targets):
        log_probs = F.log_softmax(logits, dim=1).gather(1, targets[:, None]).squeeze(1)
        return (-((1 - log_probs.exp()) ** self.gamma) * log_probs).mean()


def make_loaders(batch_size):
    generator = torch.Generator().manual_seed(0)
    centers = 3 * torch.randn(4, 8, generator=generator)
    labels = torch.randint(0, 4, (320,), generator=generator)
    features = centers[labels] + torch.randn(320, 8, generator=generator)
    train = TensorDataset(features[:256], labels[:256])
    val = TensorDataset(features[256:], labels[256:])
    train_sampler = DistributedSampler(train, shuffle=True) if DISTRIBUTED else None
    train_loader = DataLoader(
        train,
        batch_size=per_process_batch_size(batch_size),
        shuffle=train_sampler is None,
        pin_memory=torch.cuda.is_available(),
        sampler=train_sampler,
    )
    val_loader = DataLoader(
        val,
        batch_size=batch_size,
        sampler=range(RANK, len(val), WORLD_SIZE) if DISTRIBUTED else None,
    )
    return train_loader, val_loader


def train_step(net, optimizer, criterion, x, y):
    optimizer.zero_grad()
    loss = criterion(net(x), y)
    loss.backward()
    optimizer.step()
    return loss


def evaluate(net, loader, device):
    net.eval()
    correct = 0
    with torch.no_grad():
        for x, y in loader:
            correct += (net(x.to(device)).argmax(1) == y.to(device)).sum().item()
        if DISTRIBUTED:  # each process evaluated its share: add up
            (correct,) = all_reduce_sums(correct)
    net.train()
    return correct / len(loader.dataset)


def train_epoch(net, optimizer, criterion, loader, device):
    batches = loader
    for x, y in batches:
        train_step(
            net,
            optimizer,
            criterion,
            x.to(device, non_blocking=True),
            y.to(device, non_blocking=True),
        )


def main():
    parser = argparse.ArgumentParser(description="Training through helper functions")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=32)
    args = parser.parse_args()
    torch.manual_seed(0)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    net = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Dropout(0.1), nn.Linear(32, 4)).to(device)
    # trained through DDP when distributed: gradients are averaged in backward()
    ddp_net = net
    if DISTRIBUTED:
        ddp_net = DDP(
            net, device_ids=[LOCAL_RANK] if next(net.parameters()).is_cuda else None
        )
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    criterion = FocalLoss()
    train_loader, val_loader = make_loaders(args.batch_size)
    evaluate_result = evaluate(net, val_loader, device)
    if RANK == 0:
        print(f"accuracy before training: {evaluate_result:.3f}")
    # Same model and data on every process so far; from here each draws its own random
    # numbers (noise, dropout, augmentation), as the GPUs of one big batch would.
    if DISTRIBUTED:
        torch.manual_seed(torch.initial_seed() + RANK)
    for epoch in range(args.epochs):
        if DISTRIBUTED:
            train_loader.sampler.set_epoch(epoch)
        train_epoch(ddp_net, optimizer, criterion, train_loader, device)
        evaluate_result2 = evaluate(net, val_loader, device)
        if RANK == 0:
            print(f"epoch {epoch}: accuracy {evaluate_result2:.3f}")
    if RANK == 0:
        torch.save(net.state_dict(), "step_functions.pt")


if __name__ == "__main__":
    main()

    if DISTRIBUTED:
        # free the models first: left to the exit, they can abort the process
        gc.collect()
        dist.destroy_process_group()
