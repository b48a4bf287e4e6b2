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


class ModelWithLoss(nn.Module):
    """A model and its loss in one `forward`: under `nn.DataParallel` each GPU
    computes the loss of its part of the batch and only the losses (one per GPU)
    are gathered, instead of every output on GPU 0."""

    def __init__(self, model, loss_fn):
        super().__init__()
        self.model = model
        self.loss_fn = loss_fn

    def forward(self, inputs, targets):
        outputs = self.model(inputs)
        loss = self.loss_fn(outputs, targets)
        return loss.unsqueeze(0)


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
if args.resume:
    state_dict = torch.load(args.resume)
    # a checkpoint saved under nn.DataParallel names its keys `module.*`
    torch.nn.modules.utils.consume_prefix_in_state_dict_if_present(
        state_dict, "module."
    )
    model.load_state_dict(state_dict)
model.to(device)
criterion = nn.CrossEntropyLoss()
optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)

model_with_loss = ModelWithLoss(model, criterion)
if next(model.parameters()).is_cuda:  # one replica per visible GPU
    model_with_loss = nn.DataParallel(model_with_loss)
for epoch in range(args.epochs):
    minority = 0
    for x, y in train_loader:
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        optimizer.zero_grad()
        loss = model_with_loss(x, y).mean()  # mean of the per-GPU losses
        loss.backward()
        optimizer.step()
        minority += int(y.sum())
    print(f"epoch {epoch}: loss {loss.item():.4f}, class-1 samples {minority}")

torch.save(model.state_dict(), args.save)
