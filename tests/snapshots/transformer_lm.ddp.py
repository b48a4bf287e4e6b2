"""Small GPT-style language model (nanoGPT-like) trained on a synthetic token corpus.

The corpus comes from a random Markov chain (each token has four likely successors), so
the model has something to learn. `--size tiny` (the default) trains in seconds on a CPU;
`--size gpu` is a 6-layer, 384-wide model with a 256-token context for benchmarking on a GPU.

Slow patterns on purpose: causal mask built on the CPU and moved to the device in every
forward (torch.triu(torch.ones(T, T)).to(device)), hand-written attention instead of
scaled_dot_product_attention, DataLoader without num_workers, DataLoader without
pin_memory, blocking .to(device) copies, loss.item() every step, no autocast.
"""
import argparse
import gc
import math
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


# corpus tokens, vocabulary, context, width, heads, layers, batch size
SIZES = {
    "tiny": (128 * 32 + 1, 64, 32, 32, 4, 2, 16),
    "gpu": (2_000_000, 4096, 256, 384, 6, 6, 64),
}


def markov_corpus(n_tokens, vocab_size, seed):
    """A walk of `n_tokens` on one fixed chain (the same in every split)."""
    chain = torch.Generator().manual_seed(0)
    successors = torch.randint(0, vocab_size, (vocab_size, 4), generator=chain).tolist()
    walk = torch.Generator().manual_seed(seed)
    choices = torch.randint(0, 4, (n_tokens,), generator=walk).tolist()
    tokens = [0]
    for choice in choices[1:]:
        tokens.append(successors[tokens[-1]][choice])
    return torch.tensor(tokens)


class TokenWindows(Dataset):
    """Consecutive windows of `block` tokens; the target is the window shifted by one."""

    def __init__(self, corpus, block):
        self.corpus = corpus
        self.block = block

    def __len__(self):
        return (len(self.corpus) - 1) // self.block

    def __getitem__(self, idx):
        chunk = self.corpus[idx * self.block: (idx + 1) * self.block + 1]
        return chunk[:-1], chunk[1:]


class CausalSelfAttention(nn.Module):
    def __init__(self, d_model, n_heads, dropout):
        super().__init__()
        self.n_heads = n_heads
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_heads, C // self.n_heads).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(k.size(-1))
        mask = torch.triu(torch.ones(T, T), diagonal=1).bool().to(x.device)
        att = self.dropout(F.softmax(att.masked_fill(mask, float("-inf")), dim=-1))
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        return self.proj(y)


class Block(nn.Module):
    def __init__(self, d_model, n_heads, dropout):
        super().__init__()
        self.ln1 = nn.LayerNorm(d_model)
        self.attn = CausalSelfAttention(d_model, n_heads, dropout)
        self.ln2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(
            nn.Linear(d_model, 4 * d_model), nn.GELU(),
            nn.Linear(4 * d_model, d_model), nn.Dropout(dropout),
        )

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, vocab_size, block, d_model, n_heads, n_layers, dropout=0.1):
        super().__init__()
        self.tok_emb = nn.Embedding(vocab_size, d_model)
        self.pos_emb = nn.Embedding(block, d_model)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.Sequential(*[Block(d_model, n_heads, dropout) for _ in range(n_layers)])
        self.ln_f = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab_size, bias=False)
        self.head.weight = self.tok_emb.weight  # weight tying
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=0.02)

    def forward(self, idx, targets):
        positions = torch.arange(idx.size(1), device=idx.device)
        x = self.drop(self.tok_emb(idx) + self.pos_emb(positions))
        logits = self.head(self.ln_f(self.blocks(x)))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1))


def main():
    parser = argparse.ArgumentParser(description="GPT on a synthetic Markov corpus")
    parser.add_argument("--size", choices=sorted(SIZES), default="tiny")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--warmup", type=int, default=4)
    args = parser.parse_args()

    torch.manual_seed(1337)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    n_tokens, vocab_size, block, d_model, n_heads, n_layers, batch_size = SIZES[args.size]

    train_set = TokenWindows(markov_corpus(n_tokens, vocab_size, seed=1), block)
    val_set = TokenWindows(markov_corpus(n_tokens // 4 + 1, vocab_size, seed=2), block)
    train_sampler = DistributedSampler(train_set, shuffle=True) if DISTRIBUTED else None
    train_loader = DataLoader(
        train_set,
        batch_size=per_process_batch_size(batch_size),
        shuffle=train_sampler is None,
        pin_memory=torch.cuda.is_available(),
        sampler=train_sampler,
    )
    val_loader = DataLoader(val_set, batch_size=batch_size)

    model = GPT(vocab_size, block, d_model, n_heads, n_layers).to(device)
    # trained through DDP when distributed: gradients are averaged in backward()
    ddp_model = model
    if DISTRIBUTED:
        ddp_model = DDP(
            model, device_ids=[LOCAL_RANK] if next(model.parameters()).is_cuda else None
        )
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1)
    total_steps = args.epochs * len(train_loader)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer,
        lambda s: min(1.0, (s + 1) / args.warmup) * 0.5 * (1 + math.cos(math.pi * s / total_steps)),
    )

    # Same model and data on every process so far; from here each draws its own random
    # numbers (noise, dropout, augmentation), as the GPUs of one big batch would.
    if DISTRIBUTED:
        torch.manual_seed(torch.initial_seed() + RANK)
    for epoch in range(args.epochs):
        if DISTRIBUTED:
            train_loader.sampler.set_epoch(epoch)
        model.train()
        for step, (x, y) in enumerate(train_loader):
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            loss = ddp_model(x, y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            scheduler.step()
            if RANK == 0:
                print(f"epoch {epoch} step {step}: loss {loss.item():.4f}")

        model.eval()
        val_loss = 0.0
        with torch.no_grad():
            for x, y in val_loader:
                val_loss += model(x.to(device), y.to(device)).item()
        if RANK == 0:
            print(f"epoch {epoch}: val loss {val_loss / len(val_loader):.4f}")

    if RANK == 0:
        torch.save(model.state_dict(), "transformer_lm.pt")


if __name__ == "__main__":
    main()

    if DISTRIBUTED:
        # free the models first: left to the exit, they can abort the process
        gc.collect()
        dist.destroy_process_group()
