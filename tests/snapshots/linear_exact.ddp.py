"""Small MLP regression with a fixed seed and unshuffled data, used to check exact equivalence.

Slow patterns on purpose: DataLoader without num_workers, DataLoader without pin_memory,
blocking .to(device) copies, loss.item() every step, torch.zeros(n).to(device)
CPU-then-move tensor creation for the per-epoch loss history.
(No dropout, no BatchNorm, shuffle=False, 512 samples = 4 * 4 * batch_size: results
must be bit-for-bit reproducible so a converted script can be compared parameter by parameter.)
"""
import argparse
import gc
import os
import warnings

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import TensorDataset, DataLoader
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


parser = argparse.ArgumentParser(description="MLP regression (deterministic)")
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("--batch-size", type=int, default=32)
parser.add_argument("--lr", type=float, default=0.05)
parser.add_argument("--seed", type=int, default=0)
parser.add_argument("--save-params", type=str, default=None,
                    help="where to torch.save the final state_dict")
args = parser.parse_args()

torch.manual_seed(args.seed)
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")

# ----- synthetic regression problem: y = sin(x . a) + x . b + noise -----
n_samples, n_features = 512, 8
g = torch.Generator().manual_seed(1234)
X = torch.randn(n_samples, n_features, generator=g)
a = torch.randn(n_features, generator=g) / n_features ** 0.5
b = torch.randn(n_features, generator=g) / n_features ** 0.5
y = (torch.sin(X @ a) + X @ b + 0.05 * torch.randn(n_samples, generator=g)).unsqueeze(1)

dataset = TensorDataset(X, y)
sampler = DistributedSampler(dataset, shuffle=False) if DISTRIBUTED else None
loader = DataLoader(
    dataset,
    batch_size=per_process_batch_size(args.batch_size),
    shuffle=False,
    pin_memory=torch.cuda.is_available(),
    sampler=sampler,
)

model = nn.Sequential(
    nn.Linear(n_features, 32),
    nn.Tanh(),
    nn.Linear(32, 32),
    nn.Tanh(),
    nn.Linear(32, 1),
).to(device)
# trained through DDP when distributed: gradients are averaged in backward()
ddp_model = model
if DISTRIBUTED:
    ddp_model = DDP(
        model, device_ids=[LOCAL_RANK] if next(model.parameters()).is_cuda else None
    )

criterion = nn.MSELoss()
optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)

epoch_losses = torch.zeros(args.epochs).to(device)
# Same model and data on every process so far; from here each draws its own random
# numbers (noise, dropout, augmentation), as the GPUs of one big batch would.
if DISTRIBUTED:
    torch.manual_seed(torch.initial_seed() + RANK)
for epoch in range(args.epochs):
    if DISTRIBUTED:
        loader.sampler.set_epoch(epoch)
    model.train()
    running = 0.0
    for step, (xb, yb) in enumerate(loader):
        xb = xb.to(device, non_blocking=True)
        yb = yb.to(device, non_blocking=True)

        optimizer.zero_grad()
        pred = ddp_model(xb)
        loss = criterion(pred, yb)
        loss.backward()
        optimizer.step()

        running += loss.item()
        if step % 4 == 0:
            if RANK == 0:
                print(f"epoch {epoch} step {step:2d} loss {loss.item():.6f}")
    epoch_losses[epoch] = running / len(loader)
    if RANK == 0:
        print(f"epoch {epoch} mean loss {epoch_losses[epoch].item():.6f}")

if RANK == 0:
    print("loss history:", [round(v, 6) for v in epoch_losses.tolist()])

if args.save_params:
    if RANK == 0:
        torch.save(model.state_dict(), args.save_params)
        print(f"saved parameters to {args.save_params}")

if DISTRIBUTED:
    # free the models first: left to the exit, they can abort the process
    del ddp_model
    gc.collect()
    dist.destroy_process_group()
