"""Small TransformerEncoder sequence classifier trained with gradient accumulation, AdamW and warmup.

Slow patterns on purpose: .item() every micro-step (total_loss += loss.item()),
torch.arange(n).to(device) CPU-then-move position ids inside forward(), DataLoader without
num_workers, DataLoader without pin_memory, blocking .to(device) copies, gradient
accumulation with a small micro-batch instead of one bigger batch, no autocast / no fused AdamW.
"""
import argparse
import math
import time

import torch
import torch.nn as nn
from torch.utils.data import Dataset, DataLoader


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
    train_loader = DataLoader(
        train_ds,
        batch_size=args.batch_size,
        shuffle=True,
        pin_memory=torch.cuda.is_available(),
    )
    val_loader = DataLoader(val_ds, batch_size=args.batch_size * 2)

    model = TransformerClassifier(vocab_size, n_classes).to(device)
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=args.weight_decay)
    accum_steps = args.accum_steps
    total_steps = args.epochs * math.ceil(len(train_loader) / accum_steps)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, get_lr_lambda(args.warmup, total_steps))

    model_with_loss = ModelWithLoss(model, criterion)
    if next(model.parameters()).is_cuda:  # one replica per visible GPU
        model_with_loss = nn.DataParallel(model_with_loss)
    for epoch in range(args.epochs):
        model.train()
        total_loss = 0.0
        t0 = time.time()
        optimizer.zero_grad()
        for step, (tokens, labels) in enumerate(train_loader):
            tokens = tokens.to(device, non_blocking=True)
            labels = labels.to(device, non_blocking=True)

            loss = model_with_loss(tokens, labels).mean()  # mean of the per-GPU losses
            loss = loss / accum_steps
            loss.backward()
            total_loss += loss.item() * accum_steps

            if (step + 1) % accum_steps == 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad()

            if (step + 1) % 8 == 0:
                print(f"epoch {epoch + 1} step {step + 1}/{len(train_loader)} "
                      f"loss {total_loss / (step + 1):.4f} lr {scheduler.get_last_lr()[0]:.2e}")

        model.eval()
        correct, seen, val_loss = 0, 0, 0.0
        with torch.no_grad():
            for tokens, labels in val_loader:
                tokens, labels = tokens.to(device), labels.to(device)
                logits = model(tokens)
                val_loss += criterion(logits, labels).item() * labels.size(0)
                correct += (logits.argmax(-1) == labels).sum().item()
                seen += labels.size(0)
        print(f"epoch {epoch + 1} done in {time.time() - t0:.2f}s | "
              f"train loss {total_loss / len(train_loader):.4f} | "
              f"val loss {val_loss / seen:.4f} | val acc {correct / seen:.3f}")

    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, args.output)


if __name__ == "__main__":
    main()
