"""MLP classifier trained with DDP started by `python -m torch.distributed.launch` (torch < 2.0 style).

Legacy distributed patterns on purpose: a `--local_rank` argument that the launcher passes,
`args.local_rank` for the device and the rank-0 prints, `dist.init_process_group()` called
unconditionally (the script cannot run without the launcher), `dist.get_world_size()` /
`dist.get_rank()`, a `DistributedSampler(dataset)` that asks the process group, the model
wrapped in DDP by the script and saved through `model.module`, a `dist.all_reduce` of the
validation accuracy and a `dist.barrier()` before the checkpoint.
"""
import argparse
import gc
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel
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

parser = argparse.ArgumentParser(description="torch.distributed.launch example")
parser.add_argument(
    "--local_rank",
    "--local-rank",
    type=int,
    default=0,
    help="set by torch.distributed.launch",
)
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("--batch-size", type=int, default=16, help="per process")
parser.add_argument("--lr", type=float, default=0.05)
args = parser.parse_args()

if torch.cuda.is_available():
    device = torch.device("cuda", LOCAL_RANK)
else:
    device = torch.device("cpu")
world_size = WORLD_SIZE
torch.manual_seed(0)

g = torch.Generator().manual_seed(7)
features = torch.randn(384, 12, generator=g)
labels = (features[:, :4].sum(dim=1) > 0).long()
train_set = TensorDataset(features[:256], labels[:256])
val_set = TensorDataset(features[256:], labels[256:])
train_sampler = DistributedSampler(train_set, num_replicas=WORLD_SIZE, rank=RANK)
train_loader = DataLoader(
    train_set,
    batch_size=args.batch_size,
    sampler=train_sampler,
    pin_memory=torch.cuda.is_available(),
)
val_loader = DataLoader(val_set, batch_size=64)

model = nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Linear(32, 2)).to(device)
# trained through DDP when distributed: gradients are averaged in backward()
ddp_model = model
if DISTRIBUTED:
    ddp_model = DDP(
        model, device_ids=[LOCAL_RANK] if next(model.parameters()).is_cuda else None
    )
optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * world_size)
criterion = nn.CrossEntropyLoss()

# Same model and data on every process so far; from here each draws its own random
# numbers (noise, dropout, augmentation), as the GPUs of one big batch would.
if DISTRIBUTED:
    torch.manual_seed(torch.initial_seed() + RANK)
for epoch in range(args.epochs):
    train_sampler.set_epoch(epoch)
    model.train()
    for step, (x, y) in enumerate(train_loader):
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        optimizer.zero_grad()
        loss = criterion(ddp_model(x), y)
        loss.backward()
        optimizer.step()
        if LOCAL_RANK == 0 and step % 4 == 0:
            print(f"epoch {epoch} step {step} loss {loss.item():.4f}")

    model.eval()
    correct = torch.zeros(1, device=device)
    with torch.no_grad():
        for x, y in val_loader:
            x, y = x.to(device), y.to(device)
            correct += (model(x).argmax(dim=1) == y).sum()
    if DISTRIBUTED:
        dist.all_reduce(correct)
    if RANK == 0:
        print(f"epoch {epoch} accuracy {correct.item() / (len(val_set) * world_size):.3f}")

if DISTRIBUTED:
    dist.barrier()
if RANK == 0:
    torch.save(model.state_dict(), "launch_local_rank.pt")

if DISTRIBUTED:
    # free the models first: left to the exit, they can abort the process
    del ddp_model
    gc.collect()
    dist.destroy_process_group()
