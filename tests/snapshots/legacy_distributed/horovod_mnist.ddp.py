"""MNIST-like CNN trained with Horovod (horovod/examples pytorch_mnist style), synthetic digits.

Legacy distributed patterns on purpose: `hvd.init()`, `torch.cuda.set_device(hvd.local_rank())`,
the learning rate scaled by `hvd.size()`, `DistributedSampler(num_replicas=hvd.size(),
rank=hvd.rank())` for training and test data, `hvd.broadcast_parameters` and
`hvd.broadcast_optimizer_state`, `hvd.DistributedOptimizer(..., compression=hvd.Compression.fp16,
backward_passes_per_step=2)` over a loop that accumulates gradients of 2 batches, test metrics
averaged with `hvd.allreduce`, prints and the checkpoint on rank 0 only.
(Horovod is not installed here: only its conversion runs.)
"""
import argparse
import contextlib
import gc
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
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


def average_over_processes(tensor):
    """The mean of `tensor` over the processes, as a new tensor (Horovod's `hvd.allreduce`)."""
    return sum_over_processes(tensor) / WORLD_SIZE


def sum_over_processes(tensor):
    """The sum of `tensor` over the processes, as a new tensor (`hvd.allreduce(op=hvd.Sum)`)."""
    tensor = tensor.detach().clone()
    if DISTRIBUTED:
        dist.all_reduce(tensor)
    return tensor


torch.backends.cudnn.benchmark = True

parser = argparse.ArgumentParser(description="Horovod MNIST-like example")
parser.add_argument("--batch-size", type=int, default=16, help="batch size of each worker")
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("--lr", type=float, default=0.01, help="learning rate of one worker")
parser.add_argument("--momentum", type=float, default=0.5)
parser.add_argument("--seed", type=int, default=42)
parser.add_argument("--accumulation-steps", type=int, default=2)
parser.add_argument("--no-cuda", action="store_true", default=False)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 4, kernel_size=5)
        self.fc1 = nn.Linear(4 * 6 * 6, 32)
        self.fc2 = nn.Linear(32, 10)

    def forward(self, x):
        x = F.relu(F.max_pool2d(self.conv1(x), 2))
        x = F.relu(self.fc1(x.flatten(1)))
        return F.log_softmax(self.fc2(x), dim=1)


def synthetic_digits(n, seed):
    """`n` noisy 1x16x16 images whose label is marked on the diagonal."""
    g = torch.Generator().manual_seed(seed)
    images = torch.randn(n, 1, 16, 16, generator=g)
    labels = torch.randint(0, 10, (n,), generator=g)
    images[torch.arange(n), 0, labels, labels] += 3.0
    return TensorDataset(images, labels)


def metric_average(val, name):
    tensor = torch.tensor(val)
    avg_tensor = average_over_processes(tensor)
    return avg_tensor.item()


def train(epoch):
    model.train()
    train_sampler.set_epoch(epoch)
    for batch_idx, (data, target) in enumerate(train_loader):
        if args.cuda:
            data, target = data.cuda(non_blocking=True), target.cuda(non_blocking=True)
        # all-reduce the gradients only on the micro-step that updates the weights
        sync_gradients = (batch_idx + 1) % args.accumulation_steps == 0
        no_sync = DISTRIBUTED and not sync_gradients
        with ddp_model.no_sync() if no_sync else contextlib.nullcontext():
            output = ddp_model(data)
            loss = F.nll_loss(output, target) / args.accumulation_steps
            loss.backward()
        if sync_gradients:
            optimizer.step()
            optimizer.zero_grad()
        if batch_idx % 8 == 0 and RANK == 0:
            print(f"epoch {epoch} [{batch_idx * len(data)}/{len(train_sampler)}] loss {loss.item():.6f}")


def test():
    model.eval()
    test_loss = 0.0
    test_accuracy = 0.0
    with torch.no_grad():
        for data, target in test_loader:
            if args.cuda:
                data, target = data.cuda(), target.cuda()
            output = model(data)
            test_loss += F.nll_loss(output, target, reduction="sum").item()
            pred = output.argmax(dim=1)
            test_accuracy += pred.eq(target).float().sum().item()
    test_loss /= len(test_sampler)
    test_accuracy /= len(test_sampler)
    test_loss = metric_average(test_loss, "avg_loss")
    test_accuracy = metric_average(test_accuracy, "avg_accuracy")
    if RANK == 0:
        print(f"test set: average loss {test_loss:.4f}, accuracy {100.0 * test_accuracy:.2f}%")


if __name__ == "__main__":
    args = parser.parse_args()
    args.cuda = not args.no_cuda and torch.cuda.is_available()

    torch.manual_seed(args.seed)

    train_dataset = synthetic_digits(256, seed=0)
    train_sampler = DistributedSampler(
        train_dataset, num_replicas=WORLD_SIZE, rank=RANK
    )
    train_loader = DataLoader(
        train_dataset,
        batch_size=args.batch_size,
        sampler=train_sampler,
        pin_memory=torch.cuda.is_available(),
    )
    test_dataset = synthetic_digits(64, seed=1)
    test_sampler = DistributedSampler(test_dataset, num_replicas=WORLD_SIZE, rank=RANK)
    test_loader = DataLoader(test_dataset, batch_size=args.batch_size, sampler=test_sampler)

    model = Net()
    if args.cuda:
        model.cuda()
    # trained through DDP when distributed: gradients are averaged in backward()
    ddp_model = model
    if DISTRIBUTED:
        ddp_model = DDP(
            model, device_ids=[LOCAL_RANK] if next(model.parameters()).is_cuda else None
        )
    # Horovod: scale the learning rate by the number of workers.
    optimizer = torch.optim.SGD(
        model.parameters(), lr=args.lr * WORLD_SIZE, momentum=args.momentum
    )
    # Horovod's fp16 compression: the gradients travel as float16
    if DISTRIBUTED:
        ddp_model.register_comm_hook(None, default_hooks.fp16_compress_hook)

    # Same model and data on every process so far; from here each draws its own random
    # numbers (noise, dropout, augmentation), as the GPUs of one big batch would.
    if DISTRIBUTED:
        torch.manual_seed(torch.initial_seed() + RANK)
    for epoch in range(1, args.epochs + 1):
        train(epoch)
        test()

    if RANK == 0:
        torch.save(model.state_dict(), "horovod_mnist.pt")

    if DISTRIBUTED:
        # free the models first: left to the exit, they can abort the process
        del ddp_model
        gc.collect()
        dist.destroy_process_group()
