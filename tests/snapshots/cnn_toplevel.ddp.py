"""Small CNN image classifier written as plain top-level code (no functions).

Slow patterns on purpose: DataLoader without num_workers, DataLoader without pin_memory,
blocking .to(device) copies, no torch.backends.cudnn.benchmark in a conv script,
loss.item() every step, torch.zeros(n).to(device) CPU-then-move tensor creation.
"""
import gc
import os
import warnings

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.optim as optim
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


torch.backends.cudnn.benchmark = True

torch.manual_seed(0)

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
if RANK == 0:
    print("Using device:", device)

# ---- hyperparameters ----
num_classes = 10
num_epochs = 2
batch_size = 32
learning_rate = 0.01

# ---- fake image data (stand-in for a real dataset) ----
# every class gets its own "template" image, samples are template + noise
g = torch.Generator().manual_seed(1234)
templates = torch.randn(num_classes, 3, 16, 16, generator=g)

train_labels = torch.randint(0, num_classes, (256,), generator=g)
train_images = templates[train_labels] + 0.8 * torch.randn(256, 3, 16, 16, generator=g)
test_labels = torch.randint(0, num_classes, (64,), generator=g)
test_images = templates[test_labels] + 0.8 * torch.randn(64, 3, 16, 16, generator=g)

train_set = TensorDataset(train_images, train_labels)
test_set = TensorDataset(test_images, test_labels)

train_sampler = DistributedSampler(train_set, shuffle=True) if DISTRIBUTED else None
train_loader = DataLoader(
    train_set,
    batch_size=per_process_batch_size(32),
    shuffle=train_sampler is None,
    pin_memory=torch.cuda.is_available(),
    sampler=train_sampler,
)
test_loader = DataLoader(test_set, batch_size=32, shuffle=False)

# ---- model ----
model = nn.Sequential(
    nn.Conv2d(3, 16, kernel_size=3, padding=1),
    nn.BatchNorm2d(16),
    nn.ReLU(),
    nn.MaxPool2d(2),          # 16 -> 8
    nn.Conv2d(16, 32, kernel_size=3, padding=1),
    nn.BatchNorm2d(32),
    nn.ReLU(),
    nn.MaxPool2d(2),          # 8 -> 4
    nn.Flatten(),
    nn.Dropout(0.25),
    nn.Linear(32 * 4 * 4, 64),
    nn.ReLU(),
    nn.Linear(64, num_classes),
)
model = model.to(device)
# trained through DDP when distributed: gradients are averaged in backward()
ddp_model = model
if DISTRIBUTED:
    ddp_model = DDP(
        model, device_ids=[LOCAL_RANK] if next(model.parameters()).is_cuda else None
    )

criterion = nn.CrossEntropyLoss()
optimizer = optim.SGD(model.parameters(), lr=learning_rate, momentum=0.9)

# ---- training ----
# Same model and data on every process so far; from here each draws its own random
# numbers (noise, dropout, augmentation), as the GPUs of one big batch would.
if DISTRIBUTED:
    torch.manual_seed(torch.initial_seed() + RANK)
for epoch in range(num_epochs):
    if DISTRIBUTED:
        train_loader.sampler.set_epoch(epoch)
    model.train()
    running_loss = 0.0
    for i, (images, labels) in enumerate(train_loader):
        images, labels = images.to(device, non_blocking=True), labels.to(
            device, non_blocking=True
        )

        optimizer.zero_grad()
        outputs = ddp_model(images)
        loss = criterion(outputs, labels)
        loss.backward()
        optimizer.step()

        running_loss += loss.item()
        if (i + 1) % 4 == 0:
            if RANK == 0:
                print('[%d, %3d] loss: %.4f' % (epoch + 1, i + 1, running_loss / 4))
            running_loss = 0.0

if RANK == 0:
    print('Finished Training')

# ---- evaluation ----
model.eval()
correct = 0
total = 0
class_correct = torch.zeros(num_classes).to(device)
class_total = torch.zeros(num_classes).to(device)
with torch.no_grad():
    for images, labels in test_loader:
        images = images.to(device)
        labels = labels.to(device)
        outputs = model(images)
        _, predicted = torch.max(outputs.data, 1)
        total += labels.size(0)
        correct += (predicted == labels).sum().item()
        for c in range(num_classes):
            mask = labels == c
            class_correct[c] += (predicted[mask] == c).sum()
            class_total[c] += mask.sum()

if RANK == 0:
    print('Accuracy on the %d test images: %.1f %%' % (total, 100 * correct / total))
for c in range(num_classes):
    if class_total[c] > 0:
        if RANK == 0:
            print(
                '  class %d: %.1f %%'
                % (c, 100 * class_correct[c].item() / class_total[c].item())
            )

if RANK == 0:
    torch.save(model.state_dict(), 'cnn_model.pth')
    print('Saved model to cnn_model.pth')

if DISTRIBUTED:
    # free the models first: left to the exit, they can abort the process
    del ddp_model
    gc.collect()
    dist.destroy_process_group()
