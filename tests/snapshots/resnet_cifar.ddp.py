"""ResNet-style CNN on synthetic CIFAR-like 32x32 images, with the augmentation done on
the CPU in the Dataset (pad + random crop, flip, blur, normalise), like a torchvision
transform pipeline.

`--size tiny` (the default) trains in seconds on a CPU; `--size gpu` is a ResNet-18-sized
run (50,000 images, batch 256) for benchmarking on a GPU. The crops and flips are drawn in
the main process when the data set is built, so a sample is the same in every process.

Slow patterns on purpose: DataLoader without num_workers while __getitem__ does real CPU
work, DataLoader without pin_memory, blocking .to(device) copies, no
torch.backends.cudnn.benchmark, no channels_last, no autocast, loss.item() every step,
correct += ....item() every eval batch.
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


def all_reduce_sums(*sums):
    """The sums over every process of `sums` (each process summed its share of a set)."""
    totals = torch.tensor(sums, dtype=torch.float64)
    dist.all_reduce(totals)
    return [type(value)(total) for value, total in zip(sums, totals.tolist())]


# DataLoader workers: the processes on this node share its CPUs.
LOCAL_WORLD_SIZE = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
CPUS_PER_PROCESS = max(1, (os.cpu_count() or 1) // LOCAL_WORLD_SIZE)


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

# train images, test images, base width, blocks per stage, batch size, blur passes
SIZES = {
    "tiny": (256, 64, 8, 1, 32, 1),
    "gpu": (50000, 10000, 64, 2, 256, 2),
}
MEAN = torch.tensor([0.49, 0.48, 0.45]).view(3, 1, 1)
STD = torch.tensor([0.25, 0.24, 0.26]).view(3, 1, 1)


class SyntheticCIFAR(Dataset):
    """uint8 images: a smooth colour template per class (the same in every split) plus noise."""

    def __init__(self, n, seed, train, blur_passes, num_classes=10):
        templates = torch.rand(num_classes, 3, 8, 8, generator=torch.Generator().manual_seed(0))
        g = torch.Generator().manual_seed(seed)
        self.labels = torch.randint(0, num_classes, (n,), generator=g)
        smooth = F.interpolate(templates, size=32, mode="bilinear", align_corners=False)
        noise = torch.rand(n, 3, 32, 32, generator=g)
        self.images = ((0.6 * smooth[self.labels] + 0.4 * noise) * 255).to(torch.uint8)
        self.offsets = torch.randint(0, 9, (n, 2), generator=g).tolist()
        self.flips = (torch.rand(n, generator=g) < 0.5).tolist()
        self.train = train
        self.blur_passes = blur_passes
        kernel = torch.tensor([1.0, 2.0, 1.0])
        self.kernel = (kernel[:, None] * kernel[None, :] / 16).expand(3, 1, 3, 3)

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, idx):
        image = self.images[idx].float() / 255
        if self.train:
            image = F.pad(image, (4, 4, 4, 4), mode="reflect")
            dy, dx = self.offsets[idx]
            image = image[:, dy:dy + 32, dx:dx + 32]
            if self.flips[idx]:
                image = image.flip(2)
            for _ in range(self.blur_passes):
                image = F.conv2d(image[None], self.kernel, padding=1, groups=3)[0]
        return (image - MEAN) / STD, self.labels[idx]


class BasicBlock(nn.Module):
    def __init__(self, in_planes, planes, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.shortcut = nn.Sequential()
        if stride != 1 or in_planes != planes:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_planes, planes, 1, stride, bias=False), nn.BatchNorm2d(planes)
            )

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class ResNet(nn.Module):
    def __init__(self, width, blocks, num_classes=10):
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, width, 3, 1, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU()
        )
        layers, in_planes = [], width
        for stage in range(4):
            planes = width * 2**stage
            for block in range(blocks):
                stride = 2 if stage > 0 and block == 0 else 1
                layers.append(BasicBlock(in_planes, planes, stride))
                in_planes = planes
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(in_planes, num_classes)

    def forward(self, x):
        x = self.layers(self.stem(x))
        return self.fc(F.adaptive_avg_pool2d(x, 1).flatten(1))


def main():
    parser = argparse.ArgumentParser(description="ResNet on synthetic CIFAR")
    parser.add_argument("--size", choices=sorted(SIZES), default="tiny")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--log-interval", type=int, default=4)
    args = parser.parse_args()

    torch.manual_seed(0)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    n_train, n_test, width, blocks, batch_size, blur_passes = SIZES[args.size]

    train_set = SyntheticCIFAR(n_train, seed=1, train=True, blur_passes=blur_passes)
    test_set = SyntheticCIFAR(n_test, seed=2, train=False, blur_passes=blur_passes)
    train_sampler = DistributedSampler(train_set, shuffle=True) if DISTRIBUTED else None
    train_loader = DataLoader(
        train_set,
        batch_size=per_process_batch_size(batch_size),
        shuffle=train_sampler is None,
        drop_last=True,
        num_workers=min(8, CPUS_PER_PROCESS),
        persistent_workers=True,
        pin_memory=torch.cuda.is_available(),
        sampler=train_sampler,
    )
    test_loader = DataLoader(
        test_set,
        batch_size=batch_size,
        sampler=range(RANK, len(test_set), WORLD_SIZE) if DISTRIBUTED else None,
    )

    model = ResNet(width, blocks).to(device)
    # trained through DDP when distributed: gradients are averaged in backward()
    ddp_model = model
    if DISTRIBUTED:
        ddp_model = DDP(
            model, device_ids=[LOCAL_RANK] if next(model.parameters()).is_cuda else None
        )
    criterion = nn.CrossEntropyLoss(label_smoothing=0.1)
    optimizer = torch.optim.SGD(
        model.parameters(), lr=args.lr, momentum=0.9, nesterov=True, weight_decay=5e-4
    )
    scheduler = torch.optim.lr_scheduler.OneCycleLR(
        optimizer, max_lr=args.lr, total_steps=args.epochs * len(train_loader)
    )

    # Same model and data on every process so far; from here each draws its own random
    # numbers (noise, dropout, augmentation), as the GPUs of one big batch would.
    if DISTRIBUTED:
        torch.manual_seed(torch.initial_seed() + RANK)
    for epoch in range(1, args.epochs + 1):
        if DISTRIBUTED:
            train_loader.sampler.set_epoch(epoch)
        model.train()
        running_loss = 0.0
        for step, (images, labels) in enumerate(train_loader, 1):
            images, labels = images.to(device, non_blocking=True), labels.to(
                device, non_blocking=True
            )
            optimizer.zero_grad()
            loss = criterion(ddp_model(images), labels)
            loss.backward()
            optimizer.step()
            scheduler.step()
            running_loss += loss.item()
            if step % args.log_interval == 0:
                if RANK == 0:
                    print(
                        f"epoch {epoch} step {step}: loss {running_loss / args.log_interval:.4f}"
                    )
                running_loss = 0.0

        model.eval()
        correct = 0
        with torch.no_grad():
            for images, labels in test_loader:
                images, labels = images.to(device), labels.to(device)
                correct += (model(images).argmax(1) == labels).sum().item()
            if DISTRIBUTED:  # each process evaluated its share: add up
                (correct,) = all_reduce_sums(correct)
        if RANK == 0:
            print(
                f"epoch {epoch}: test accuracy {100.0 * correct / len(test_set):.1f}%"
            )

    if RANK == 0:
        torch.save(model.state_dict(), "resnet_cifar.pt")


if __name__ == "__main__":
    main()

    if DISTRIBUTED:
        # free the models first: left to the exit, they can abort the process
        gc.collect()
        dist.destroy_process_group()
