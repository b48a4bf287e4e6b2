"""MLP on synthetic tabular data, organised around a hand-written Trainer class.

Slow patterns on purpose: total_loss += loss (tensor accumulation that keeps every step's
autograd graph alive until the epoch ends), validate() without torch.no_grad(),
Adam with weight_decay (coupled L2 instead of AdamW), DataLoader without num_workers,
DataLoader without pin_memory, blocking .to(device) copies, .item() every validation step.
"""
import argparse
import gc
import os
import warnings

import torch
import torch.distributed as dist
import torch.nn as nn
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


class TabularDataset(Dataset):
    """Synthetic tabular classification data: 20 numeric features, 3 classes."""

    def __init__(self, n_samples, n_features=20, n_classes=3, seed=0):
        g = torch.Generator().manual_seed(seed)
        w = torch.randn(n_features, n_classes, generator=torch.Generator().manual_seed(42))
        self.X = torch.randn(n_samples, n_features, generator=g)
        logits = self.X @ w + 0.5 * torch.randn(n_samples, n_classes, generator=g)
        self.y = logits.argmax(dim=1)

    def __len__(self):
        return len(self.X)

    def __getitem__(self, idx):
        return self.X[idx], self.y[idx]


class MLP(nn.Module):
    def __init__(self, in_dim, hidden_dim, out_dim, dropout=0.1):
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(in_dim, hidden_dim),
            nn.ReLU(),
            nn.Dropout(dropout),
            nn.Linear(hidden_dim, hidden_dim),
            nn.ReLU(),
            nn.Dropout(dropout),
            nn.Linear(hidden_dim, out_dim),
        )

    def forward(self, x):
        return self.net(x)


class Trainer:
    def __init__(self, model, train_loader, val_loader, lr=1e-3, weight_decay=1e-4,
                 checkpoint_dir="checkpoints", device=None):
        self.device = device or torch.device("cuda" if torch.cuda.is_available() else "cpu")
        self.model = model.to(self.device)
        # trained through DDP when distributed: gradients are averaged in backward()
        self.ddp_model = self.model
        if DISTRIBUTED:
            self.ddp_model = DDP(
                self.model,
                device_ids=(
                    [LOCAL_RANK] if next(self.model.parameters()).is_cuda else None
                ),
            )
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=lr, weight_decay=weight_decay)
        self.criterion = nn.CrossEntropyLoss()
        self.train_loader = train_loader
        self.val_loader = val_loader
        self.checkpoint_dir = checkpoint_dir
        self.best_val_acc = 0.0
        self.history = {"train_loss": [], "val_loss": [], "val_acc": []}

    def train_epoch(self):
        self.model.train()
        total_loss = 0
        for inputs, targets in self.train_loader:
            inputs = inputs.to(self.device, non_blocking=True)
            targets = targets.to(self.device, non_blocking=True)

            self.optimizer.zero_grad()
            outputs = self.ddp_model(inputs)
            loss = self.criterion(outputs, targets)
            loss.backward()
            self.optimizer.step()

            total_loss += loss.detach()
        return total_loss.item() / len(self.train_loader)

    def validate(self):
        self.model.eval()
        val_loss = 0.0
        correct = 0
        total = 0
        with torch.no_grad():
            for inputs, targets in self.val_loader:
                inputs = inputs.to(self.device)
                targets = targets.to(self.device)
                outputs = self.model(inputs)
                loss = self.criterion(outputs, targets)
                val_loss += loss.item()
                preds = outputs.argmax(dim=1)
                correct += (preds == targets).sum().item()
                total += targets.size(0)
        return val_loss / len(self.val_loader), correct / total

    def save_checkpoint(self, epoch, is_best=False):
        if RANK != 0:
            return  # only rank 0 writes
        os.makedirs(self.checkpoint_dir, exist_ok=True)
        state = {
            "epoch": epoch,
            "model_state_dict": self.model.state_dict(),
            "optimizer_state_dict": self.optimizer.state_dict(),
            "best_val_acc": self.best_val_acc,
        }
        path = os.path.join(self.checkpoint_dir, "last.pt")
        torch.save(state, path)
        if is_best:
            torch.save(state, os.path.join(self.checkpoint_dir, "best.pt"))

    def fit(self, epochs):
        for epoch in range(1, epochs + 1):
            if DISTRIBUTED:
                self.train_loader.sampler.set_epoch(epoch)
            train_loss = self.train_epoch()
            val_loss, val_acc = self.validate()
            self.history["train_loss"].append(train_loss)
            self.history["val_loss"].append(val_loss)
            self.history["val_acc"].append(val_acc)

            is_best = val_acc > self.best_val_acc
            if is_best:
                self.best_val_acc = val_acc
            self.save_checkpoint(epoch, is_best)
            if RANK == 0:
                print(f"Epoch {epoch}/{epochs} - train_loss: {train_loss:.4f} - "
                      f"val_loss: {val_loss:.4f} - val_acc: {val_acc:.4f}"
                      + (" *" if is_best else ""))
        return self.history


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="Train an MLP on tabular data")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--weight-decay", type=float, default=1e-4)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--checkpoint-dir", type=str, default="checkpoints")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    torch.manual_seed(args.seed)

    train_ds = TabularDataset(1024, seed=args.seed)
    val_ds = TabularDataset(256, seed=args.seed + 1)
    train_sampler = DistributedSampler(train_ds, shuffle=True) if DISTRIBUTED else None
    train_loader = DataLoader(
        train_ds,
        batch_size=per_process_batch_size(args.batch_size),
        shuffle=train_sampler is None,
        pin_memory=torch.cuda.is_available(),
        sampler=train_sampler,
    )
    val_loader = DataLoader(val_ds, batch_size=args.batch_size)

    model = MLP(20, args.hidden, 3)
    trainer = Trainer(model, train_loader, val_loader, lr=args.lr,
                      weight_decay=args.weight_decay, checkpoint_dir=args.checkpoint_dir)
    # Same model and data on every process so far; from here each draws its own random
    # numbers (noise, dropout, augmentation), as the GPUs of one big batch would.
    if DISTRIBUTED:
        torch.manual_seed(torch.initial_seed() + RANK)
    history = trainer.fit(args.epochs)
    if RANK == 0:
        print(f"Best val acc: {trainer.best_val_acc:.4f}")

    if DISTRIBUTED:
        # free the models first: left to the exit, they can abort the process
        del trainer
        gc.collect()
        dist.destroy_process_group()
