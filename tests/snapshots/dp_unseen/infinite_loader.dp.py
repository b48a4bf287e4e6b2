"""A step loop with no end of its own (`while True`, stopped after `--max-steps`) that
draws each batch with `.next()` of the script's own class around a `DataLoader` over a
sampler with replacement, moves it to the device with a list comprehension and unpacks
it (makemore's shape, written anew). `X` and `Y` come from the batch, so they are
batch-first; the model returns its logits and its own (averaged) loss."""
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, RandomSampler, TensorDataset


class LossInForward(nn.Module):
    """A model and its loss in one `forward`: under `nn.DataParallel` each GPU runs
    `compute` on its part of the batch (every tensor argument split along
    dimension 0) and only the losses (one per GPU) are gathered, instead of every
    output on GPU 0. `modules`, the models and losses `compute` calls, are
    replicated to every GPU and passed to it first."""

    def __init__(self, compute, *modules):
        super().__init__()
        self.compute = compute
        self.parts = nn.ModuleList(modules)

    def forward(self, *batch):
        returned = self.compute(*self.parts, *batch)  # the loss, or (loss, *kept)
        if isinstance(returned, tuple):
            return (returned[0].unsqueeze(0), *returned[1:])
        return returned.unsqueeze(0)


class EndlessBatches:
    """Batches without end: the loader is started again when it runs out."""

    def __init__(self, dataset, **kwargs):
        sampler = RandomSampler(dataset, replacement=True, num_samples=10**6)
        self.loader = DataLoader(dataset, sampler=sampler, **kwargs)
        self.batches = iter(self.loader)

    def next(self):
        try:
            batch = next(self.batches)
        except StopIteration:
            self.batches = iter(self.loader)
            batch = next(self.batches)
        return batch


class Bigram(nn.Module):
    def __init__(self, vocab, width):
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.head = nn.Linear(width, vocab)

    def forward(self, idx, targets):
        logits = self.head(torch.tanh(self.embed(idx)))
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
        return logits, loss


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--max-steps", type=int, default=12)
    args = parser.parse_args()
    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    tokens = torch.randint(0, 11, (64, 9))
    dataset = TensorDataset(tokens[:, :-1], tokens[:, 1:])
    batch_loader = EndlessBatches(dataset, batch_size=8)
    model = Bigram(11, 16).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    step = 0

    def compute_loss(model, X, Y):
        # runs on each GPU's part of the batch
        logits, loss = model(X, Y)
        return loss

    loss_on_gpus = LossInForward(compute_loss, model)
    if next(model.parameters()).is_cuda:  # one replica per visible GPU
        loss_on_gpus = nn.DataParallel(loss_on_gpus)
    while True:
        batch = batch_loader.next()
        batch = [t.to(device) for t in batch]
        X, Y = batch
        loss = loss_on_gpus(X, Y).mean()  # mean of the per-GPU losses
        model.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if step % 4 == 0:
            print(f"step {step} | loss {loss.item():.4f}")
        step += 1
        if step >= args.max_steps:
            break
