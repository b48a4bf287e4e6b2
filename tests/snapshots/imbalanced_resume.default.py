"""Imbalanced classifier: a WeightedRandomSampler balances the classes, the model is
wrapped in nn.DataParallel, and a run can resume from the checkpoint of an earlier one.

What a conversion must keep: the sampler's weights (under ddp each process draws its
share of the weighted indices, never a uniform DistributedSampler's), and old
checkpoints, saved under nn.DataParallel with `module.`-prefixed keys, must still load
once the conversion has removed the wrapper.
Slow patterns on purpose: nn.DataParallel, blocking .to(device) copies, loss.item()
every step.
"""
import argparse

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, Dataset, WeightedRandomSampler

parser = argparse.ArgumentParser(description="Imbalanced classes, weighted sampling")
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("--batch-size", type=int, default=32)
parser.add_argument("--lr", type=float, default=0.05)
parser.add_argument("--seed", type=int, default=0)
parser.add_argument("--resume", type=str, default=None, help="checkpoint to start from")
parser.add_argument("--save", type=str, default="imbalanced.pt")
args = parser.parse_args()

torch.manual_seed(args.seed)
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")


class Jittered(Dataset):
    """Samples rescaled as they are read: per-sample work, as an augmentation would be."""

    def __init__(self, features, labels):
        self.features, self.labels = features, labels

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, index):
        return self.features[index] * 1.01, self.labels[index]


# 448 samples of class 0, 64 of class 1: without weights a batch holds 1/8 of class 1
g = torch.Generator().manual_seed(7)
labels = torch.cat([torch.zeros(448, dtype=torch.long), torch.ones(64, dtype=torch.long)])
features = torch.randn(512, 6, generator=g) + labels.unsqueeze(1) * 0.8
dataset = Jittered(features, labels)
class_counts = torch.bincount(labels).double()
sampler = WeightedRandomSampler(1.0 / class_counts[labels], num_samples=len(labels))
train_loader = DataLoader(
    dataset,
    batch_size=args.batch_size,
    sampler=sampler,
    pin_memory=torch.cuda.is_available(),
)

model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 2))
model = nn.DataParallel(model)
if args.resume:
    model.load_state_dict(torch.load(args.resume))
model.to(device)
criterion = nn.CrossEntropyLoss()
optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)

for epoch in range(args.epochs):
    minority = 0
    for x, y in train_loader:
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        optimizer.zero_grad()
        with torch.autocast(
            device_type=device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"
        ):
            loss = criterion(model(x), y)
        loss.backward()
        optimizer.step()
        minority += int(y.sum())
    print(f"epoch {epoch}: loss {loss.item():.4f}, class-1 samples {minority}")

torch.save(model.state_dict(), args.save)
