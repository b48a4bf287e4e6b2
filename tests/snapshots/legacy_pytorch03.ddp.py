"""Small convnet classifier written for PyTorch 0.3 (Variable era); crashes on current PyTorch.

Slow patterns on purpose: torch.autograd.Variable wrapping, Variable(..., volatile=True)
instead of torch.no_grad() in evaluation (volatile is a no-op today, so eval builds graphs),
loss.data[0] (IndexError on 0-dim tensors since 0.4), size_average=False instead of
reduction='sum', F.log_softmax without dim, model.cuda() / data.cuda() under if args.cuda
(blocking copies), DataLoader without num_workers and with pin_memory only under args.cuda,
no torch.backends.cudnn.benchmark in a conv script, loss.data[0] accumulated every step.
"""
from __future__ import print_function
import argparse
import gc
import os
import warnings

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import Dataset, DataLoader
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


torch.backends.cudnn.benchmark = True

# Training settings
parser = argparse.ArgumentParser(description='PyTorch 0.3 style classifier')
parser.add_argument('--batch-size', type=int, default=32, metavar='N',
                    help='input batch size for training (default: 32)')
parser.add_argument('--test-batch-size', type=int, default=64, metavar='N',
                    help='input batch size for testing (default: 64)')
parser.add_argument('--epochs', type=int, default=2, metavar='N',
                    help='number of epochs to train (default: 2)')
parser.add_argument('--lr', type=float, default=0.05, metavar='LR',
                    help='learning rate (default: 0.05)')
parser.add_argument('--momentum', type=float, default=0.5, metavar='M',
                    help='SGD momentum (default: 0.5)')
parser.add_argument('--no-cuda', action='store_true', default=False,
                    help='disables CUDA training')
parser.add_argument('--seed', type=int, default=1, metavar='S',
                    help='random seed (default: 1)')
parser.add_argument('--log-interval', type=int, default=2, metavar='N',
                    help='how many batches to wait before logging training status')
args = parser.parse_args()
args.cuda = not args.no_cuda and torch.cuda.is_available()

torch.manual_seed(args.seed)
if args.cuda:
    torch.cuda.manual_seed(args.seed)


class RandomDigits(Dataset):
    """Deterministic fake 1x20x20 digit images, 10 classes."""

    def __init__(self, n, seed):
        g = torch.Generator()
        g.manual_seed(seed)
        centers = torch.randn(10, 1, 20, 20, generator=torch.Generator().manual_seed(0))
        self.labels = torch.randint(0, 10, (n,), generator=g)
        self.images = centers[self.labels] + 0.7 * torch.randn(n, 1, 20, 20, generator=g)

    def __getitem__(self, idx):
        return self.images[idx], self.labels[idx]

    def __len__(self):
        return self.labels.size(0)


kwargs = {'num_workers': 1, 'pin_memory': True} if args.cuda else {}
train_dataset = RandomDigits(256, seed=args.seed)
train_sampler = DistributedSampler(train_dataset, shuffle=True) if DISTRIBUTED else None
train_loader = DataLoader(
    train_dataset,
    batch_size=per_process_batch_size(args.batch_size),
    shuffle=train_sampler is None,
    sampler=train_sampler,
    **kwargs
)
test_loader = DataLoader(RandomDigits(128, seed=args.seed + 1),
                         batch_size=args.test_batch_size, shuffle=True, **kwargs)


class Net(nn.Module):
    def __init__(self):
        super(Net, self).__init__()
        self.conv1 = nn.Conv2d(1, 10, kernel_size=5)
        self.conv2 = nn.Conv2d(10, 20, kernel_size=5)
        self.conv2_drop = nn.Dropout2d()
        self.fc1 = nn.Linear(80, 50)
        self.fc2 = nn.Linear(50, 10)

    def forward(self, x):
        x = F.relu(F.max_pool2d(self.conv1(x), 2))
        x = F.relu(F.max_pool2d(self.conv2_drop(self.conv2(x)), 2))
        x = x.view(-1, 80)
        x = F.relu(self.fc1(x))
        x = F.dropout(x, training=self.training)
        x = self.fc2(x)
        return F.log_softmax(x)


model = Net()
if args.cuda:
    model.cuda()
# trained through DDP when distributed: gradients are averaged in backward()
ddp_model = model
if DISTRIBUTED:
    ddp_model = DDP(
        model, device_ids=[LOCAL_RANK] if next(model.parameters()).is_cuda else None
    )

optimizer = optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)


def train(epoch):
    model.train()
    epoch_loss = 0
    for batch_idx, (data, target) in enumerate(train_loader):
        if args.cuda:
            data, target = data.cuda(non_blocking=True), target.cuda(non_blocking=True)
        optimizer.zero_grad()
        output = ddp_model(data)
        loss = F.nll_loss(output, target)
        loss.backward()
        optimizer.step()
        epoch_loss += loss.item()
        if batch_idx % args.log_interval == 0:
            if RANK == 0:
                print('Train Epoch: {} [{}/{} ({:.0f}%)]\tLoss: {:.6f}'.format(
                    epoch, batch_idx * len(data), len(train_loader.sampler),
                    100. * batch_idx / len(train_loader), loss.item()))
    if RANK == 0:
        print(
            'Epoch {} average loss: {:.4f}'.format(
                epoch, epoch_loss / len(train_loader)
            )
        )


def test():
    model.eval()
    test_loss = 0
    correct = 0
    with torch.no_grad():
        for data, target in test_loader:
            if args.cuda:
                data, target = data.cuda(non_blocking=True), target.cuda(
                    non_blocking=True
                )
            output = model(data)
            test_loss += F.nll_loss(
                output, target, size_average=False
            ).item()  # sum up batch loss
            pred = output.data.max(1, keepdim=True)[
                1
            ]  # get the index of the max log-probability
            correct += pred.eq(target.data.view_as(pred)).long().cpu().sum()

    test_loss /= len(test_loader.dataset)
    if RANK == 0:
        print('\nTest set: Average loss: {:.4f}, Accuracy: {}/{} ({:.0f}%)\n'.format(
            test_loss, correct, len(test_loader.dataset),
            100. * correct / len(test_loader.dataset)))


# Same model and data on every process so far; from here each draws its own random
# numbers (noise, dropout, augmentation), as the GPUs of one big batch would.
if DISTRIBUTED:
    torch.manual_seed(torch.initial_seed() + RANK)
for epoch in range(1, args.epochs + 1):
    if DISTRIBUTED:
        train_loader.sampler.set_epoch(epoch)
    train(epoch)
    test()

if RANK == 0:
    torch.save(model.state_dict(), 'legacy_model.pth')

if DISTRIBUTED:
    # free the models first: left to the exit, they can abort the process
    del ddp_model
    gc.collect()
    dist.destroy_process_group()
