"""CNN with BatchNorm trained with NVIDIA apex.parallel (apex's imagenet example style), synthetic images.

Legacy distributed patterns on purpose: `apex.parallel.DistributedDataParallel` with
`delay_allreduce=True`, `apex.parallel.convert_syncbn_model` under `--sync_bn`, a
`--local_rank` argument set by `torch.distributed.launch`, `torch.distributed.init_process_group`
and `torch.cuda.set_device(args.local_rank)` under `if args.distributed:`,
`torch.distributed.get_world_size()` for the learning rate, checkpoints of `model.module`
saved by local rank 0.
"""
import argparse
import gc
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset

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

torch.backends.cudnn.benchmark = True

parser = argparse.ArgumentParser(description="apex.parallel example")
parser.add_argument("--local_rank", "--local-rank", default=0, type=int)
parser.add_argument("--sync_bn", action="store_true", help="BatchNorm statistics over all processes")
parser.add_argument("--epochs", default=2, type=int)
parser.add_argument("--batch-size", default=16, type=int, help="per process")
parser.add_argument("--lr", default=0.02, type=float, help="for one process; scaled by the world size")
args = parser.parse_args()


class SmallCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.fc = nn.Linear(8 * 4 * 4, 5)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn(self.conv(x))), 2)
        return self.fc(x.flatten(1))


args.distributed = False
if "WORLD_SIZE" in os.environ:
    args.distributed = int(os.environ["WORLD_SIZE"]) > 1
args.world_size = 1
if args.distributed:
    args.world_size = WORLD_SIZE
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
torch.manual_seed(0)

g = torch.Generator().manual_seed(3)
images = torch.randn(256, 3, 8, 8, generator=g)
targets = torch.randint(0, 5, (256,), generator=g)
images[torch.arange(256), targets % 3, targets, targets] += 2.0
dataset = TensorDataset(images, targets)
sampler = (
    torch.utils.data.distributed.DistributedSampler(
        dataset, num_replicas=WORLD_SIZE, rank=RANK
    )
    if args.distributed
    else None
)
loader = DataLoader(
    dataset,
    batch_size=args.batch_size,
    shuffle=sampler is None,
    sampler=sampler,
    pin_memory=torch.cuda.is_available(),
)

model = SmallCNN()
if args.sync_bn:
    model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)
model = model.to(device)
# trained through DDP when distributed: gradients are averaged in backward()
ddp_model = model
if DISTRIBUTED:
    ddp_model = DDP(
        model, device_ids=[LOCAL_RANK] if next(model.parameters()).is_cuda else None
    )
optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * args.world_size, momentum=0.9)

# Same model and data on every process so far; from here each draws its own random
# numbers (noise, dropout, augmentation), as the GPUs of one big batch would.
if DISTRIBUTED:
    torch.manual_seed(torch.initial_seed() + RANK)
for epoch in range(args.epochs):
    if args.distributed:
        sampler.set_epoch(epoch)
    model.train()
    for i, (x, y) in enumerate(loader):
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        loss = F.cross_entropy(ddp_model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if LOCAL_RANK == 0 and i % 4 == 0:
            print(f"epoch {epoch} iter {i} loss {loss.item():.4f}")

if LOCAL_RANK == 0:
    state = model.state_dict() if args.distributed else model.state_dict()
    torch.save(state, "apex_parallel.pt")

if DISTRIBUTED:
    # free the models first: left to the exit, they can abort the process
    del ddp_model
    gc.collect()
    dist.destroy_process_group()
