"""1-D CNN signal classifier that already wraps the model in nn.DataParallel when >1 GPU is visible.

Slow patterns on purpose: nn.DataParallel (single-process, GIL-bound) with the loss computed
outside forward (outputs gathered on GPU 0 before the loss), DataLoader without num_workers,
DataLoader without pin_memory, blocking .to(device) copies, no torch.backends.cudnn.benchmark
in a conv script, running_loss += loss.item() every step.
"""
import argparse
import gc
import os
import time
import warnings

import torch
import torch.distributed as dist
import torch.nn as nn
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


class SignalDataset(Dataset):
    """Noisy sine waves; the class is the frequency bucket (4 classes), 1 channel x 64 steps."""

    def __init__(self, num_samples=512, length=64, num_classes=4, seed=0):
        g = torch.Generator().manual_seed(seed)
        self.labels = torch.randint(0, num_classes, (num_samples,), generator=g)
        t = torch.linspace(0, 1, length)
        freqs = (self.labels.float() + 1) * 3.0
        phase = torch.rand(num_samples, 1, generator=g) * 6.28
        clean = torch.sin(2 * 3.14159 * freqs.unsqueeze(1) * t.unsqueeze(0) + phase)
        self.signals = (clean + 0.3 * torch.randn(num_samples, length, generator=g)).unsqueeze(1)

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, idx):
        return self.signals[idx], self.labels[idx]


class SignalNet(nn.Module):
    def __init__(self, num_classes=4):
        super(SignalNet, self).__init__()
        self.features = nn.Sequential(
            nn.Conv1d(1, 16, kernel_size=5, padding=2),
            nn.BatchNorm1d(16),
            nn.ReLU(inplace=True),
            nn.MaxPool1d(2),
            nn.Conv1d(16, 32, kernel_size=5, padding=2),
            nn.BatchNorm1d(32),
            nn.ReLU(inplace=True),
            nn.AdaptiveAvgPool1d(1),
        )
        self.classifier = nn.Linear(32, num_classes)

    def forward(self, x):
        x = self.features(x)
        x = x.view(x.size(0), -1)
        return self.classifier(x)


parser = argparse.ArgumentParser(description="Signal classification")
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("--batch-size", type=int, default=32)
parser.add_argument("--lr", type=float, default=0.01)
parser.add_argument("--save-dir", type=str, default=".")
args = parser.parse_args()

torch.manual_seed(0)
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")

train_dataset = SignalDataset(512, seed=1)
val_dataset = SignalDataset(128, seed=2)
train_sampler = DistributedSampler(train_dataset, shuffle=True) if DISTRIBUTED else None
train_loader = DataLoader(
    train_dataset,
    batch_size=per_process_batch_size(args.batch_size),
    shuffle=train_sampler is None,
    pin_memory=torch.cuda.is_available(),
    sampler=train_sampler,
)
val_loader = DataLoader(val_dataset, batch_size=args.batch_size, shuffle=False)

model = SignalNet(num_classes=4)
model.to(device)
# trained through DDP when distributed: gradients are averaged in backward()
ddp_model = model
if DISTRIBUTED:
    ddp_model = DDP(
        model, device_ids=[LOCAL_RANK] if next(model.parameters()).is_cuda else None
    )

criterion = nn.CrossEntropyLoss()
optimizer = optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, weight_decay=5e-4)

best_acc = 0.0
# Same model and data on every process so far; from here each draws its own random
# numbers (noise, dropout, augmentation), as the GPUs of one big batch would.
if DISTRIBUTED:
    torch.manual_seed(torch.initial_seed() + RANK)
for epoch in range(args.epochs):
    if DISTRIBUTED:
        train_loader.sampler.set_epoch(epoch)
    model.train()
    running_loss = 0.0
    start = time.time()
    for i, (inputs, labels) in enumerate(train_loader):
        inputs = inputs.to(device, non_blocking=True)
        labels = labels.to(device, non_blocking=True)

        optimizer.zero_grad()
        outputs = ddp_model(inputs)
        loss = criterion(outputs, labels)
        loss.backward()
        optimizer.step()

        running_loss += loss.item()
        if i % 5 == 4:
            if RANK == 0:
                print(
                    "[epoch %d, batch %2d] loss: %.3f"
                    % (epoch + 1, i + 1, running_loss / 5)
                )
            running_loss = 0.0

    model.eval()
    correct = 0
    total = 0
    with torch.no_grad():
        for inputs, labels in val_loader:
            inputs, labels = inputs.to(device), labels.to(device)
            outputs = model(inputs)
            _, predicted = outputs.max(1)
            total += labels.size(0)
            correct += predicted.eq(labels).sum().item()
    acc = 100.0 * correct / total
    if RANK == 0:
        print(
            "epoch %d: val acc %.2f%% (%.2fs)" % (epoch + 1, acc, time.time() - start)
        )

    if acc > best_acc:
        best_acc = acc
        if isinstance(model, nn.DataParallel):
            state_dict = model.module.state_dict()
        else:
            state_dict = model.state_dict()
        if RANK == 0:
            torch.save(state_dict, os.path.join(args.save_dir, "signal_best.pth"))

if RANK == 0:
    print("best val acc: %.2f%%" % best_acc)

if DISTRIBUTED:
    # free the models first: left to the exit, they can abort the process
    del ddp_model
    gc.collect()
    dist.destroy_process_group()
