"""Small TransformerEncoder sequence classifier trained with gradient accumulation, AdamW and warmup.

Slow patterns on purpose: .item() every micro-step (total_loss += loss.item()),
torch.arange(n).to(device) CPU-then-move position ids inside forward(), DataLoader without
num_workers, DataLoader without pin_memory, blocking .to(device) copies, gradient
accumulation with a small micro-batch instead of one bigger batch, no autocast / no fused AdamW.
"""
import argparse
import contextlib
import gc
import math
import os
import time
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


class SyntheticSequences(Dataset):
    """Random token sequences; the label is decided by which 'keyword' token appears most."""

    def __init__(self, n_samples, seq_len, vocab_size, n_classes, seed):
        g = torch.Generator().manual_seed(seed)
        self.tokens = torch.randint(n_classes, vocab_size, (n_samples, seq_len), generator=g)
        self.labels = torch.randint(0, n_classes, (n_samples,), generator=g)
        # plant the keyword for the label a few times in each sequence
        for k in range(3):
            pos = torch.randint(0, seq_len, (n_samples,), generator=g)
            self.tokens[torch.arange(n_samples), pos] = self.labels

    def __len__(self):
        return self.tokens.size(0)

    def __getitem__(self, idx):
        return self.tokens[idx], self.labels[idx]


class TransformerClassifier(nn.Module):
    def __init__(self, vocab_size, n_classes, d_model=32, nhead=4, num_layers=2,
                 dim_feedforward=64, max_len=64, dropout=0.1):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, d_model)
        self.pos_embed = nn.Embedding(max_len, d_model)
        layer = nn.TransformerEncoderLayer(d_model, nhead, dim_feedforward, dropout,
                                           batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, num_layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, n_classes)

    def forward(self, x):
        seq_len = x.size(1)
        positions = torch.arange(seq_len).unsqueeze(0).to(x.device)
        h = self.embed(x) * math.sqrt(self.embed.embedding_dim) + self.pos_embed(positions)
        h = self.encoder(h)
        h = self.norm(h.mean(dim=1))
        return self.head(h)


def get_lr_lambda(warmup_steps, total_steps):
    def lr_lambda(step):
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
        return max(0.0, 0.5 * (1.0 + math.cos(math.pi * progress)))
    return lr_lambda


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--accum-steps", type=int, default=4)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--weight-decay", type=float, default=0.01)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--seq-len", type=int, default=16)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--output", type=str, default="transformer.pt")
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")

    vocab_size, n_classes = 64, 4
    train_ds = SyntheticSequences(384, args.seq_len, vocab_size, n_classes, seed=args.seed)
    val_ds = SyntheticSequences(96, args.seq_len, vocab_size, n_classes, seed=args.seed + 1)
    train_sampler = DistributedSampler(train_ds, shuffle=True) if DISTRIBUTED else None
    train_loader = DataLoader(
        train_ds,
        batch_size=per_process_batch_size(args.batch_size),
        shuffle=train_sampler is None,
        pin_memory=torch.cuda.is_available(),
        sampler=train_sampler,
    )
    val_loader = DataLoader(val_ds, batch_size=args.batch_size * 2)

    model = TransformerClassifier(vocab_size, n_classes).to(device)
    # trained through DDP when distributed: gradients are averaged in backward()
    ddp_model = model
    if DISTRIBUTED:
        ddp_model = DDP(
            model, device_ids=[LOCAL_RANK] if next(model.parameters()).is_cuda else None
        )
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=args.weight_decay)
    accum_steps = args.accum_steps
    total_steps = args.epochs * math.ceil(len(train_loader) / accum_steps)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, get_lr_lambda(args.warmup, total_steps))

    # Same model and data on every process so far; from here each draws its own random
    # numbers (noise, dropout, augmentation), as the GPUs of one big batch would.
    if DISTRIBUTED:
        torch.manual_seed(torch.initial_seed() + RANK)
    for epoch in range(args.epochs):
        if DISTRIBUTED:
            train_loader.sampler.set_epoch(epoch)
        model.train()
        total_loss = 0.0
        t0 = time.time()
        optimizer.zero_grad()
        for step, (tokens, labels) in enumerate(train_loader):
            tokens = tokens.to(device, non_blocking=True)
            labels = labels.to(device, non_blocking=True)

            # all-reduce the gradients only on the micro-step that updates the weights
            sync_gradients = (step + 1) % accum_steps == 0
            no_sync = DISTRIBUTED and not sync_gradients
            with ddp_model.no_sync() if no_sync else contextlib.nullcontext():
                logits = ddp_model(tokens)
                loss = criterion(logits, labels)
                loss = loss / accum_steps
                loss.backward()
            total_loss += loss.item() * accum_steps

            if sync_gradients:
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad()

            if (step + 1) % 8 == 0:
                if RANK == 0:
                    print(
                        f"epoch {epoch + 1} step {step + 1}/{len(train_loader)} "
                        f"loss {total_loss / (step + 1):.4f} lr {scheduler.get_last_lr()[0]:.2e}"
                    )

        model.eval()
        correct, seen, val_loss = 0, 0, 0.0
        with torch.no_grad():
            for tokens, labels in val_loader:
                tokens, labels = tokens.to(device), labels.to(device)
                logits = model(tokens)
                val_loss += criterion(logits, labels).item() * labels.size(0)
                correct += (logits.argmax(-1) == labels).sum().item()
                seen += labels.size(0)
        if RANK == 0:
            print(f"epoch {epoch + 1} done in {time.time() - t0:.2f}s | "
                  f"train loss {total_loss / len(train_loader):.4f} | "
                  f"val loss {val_loss / seen:.4f} | val acc {correct / seen:.3f}")

    if RANK == 0:
        torch.save(
            {"model": model.state_dict(), "optimizer": optimizer.state_dict()},
            args.output,
        )


if __name__ == "__main__":
    main()

    if DISTRIBUTED:
        # free the models first: left to the exit, they can abort the process
        gc.collect()
        dist.destroy_process_group()
