"""Classifier on synthetic clusters, trained through helper functions.

The training step is a function (`train_step`) called from the loader loop of
`train_epoch`; the loaders come from `make_loaders()`; the loss is a module of the
script's own (`FocalLoss`, an `nn.Module` with no parameters); the model is evaluated
once before training starts, through another loader loop. Each is a shape a converter
must follow through calls: the training loader (not the validation one) is sharded,
the model (not the loss) trains through DDP, and `set_epoch` goes where the epoch loop
runs the training function.

Slow patterns on purpose: DataLoader without num_workers, blocking `.to()` copies,
evaluation without `torch.no_grad()`.
"""
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset


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


class FocalLoss(nn.Module):
    """Cross-entropy that weighs down the examples the model already gets right."""

    def __init__(self, gamma=2.0):
        super().__init__()
        self.gamma = gamma

    def forward(self, logits, targets):
        log_probs = F.log_softmax(logits, dim=1).gather(1, targets[:, None]).squeeze(1)
        return (-((1 - log_probs.exp()) ** self.gamma) * log_probs).mean()


def make_loaders(batch_size):
    generator = torch.Generator().manual_seed(0)
    centers = 3 * torch.randn(4, 8, generator=generator)
    labels = torch.randint(0, 4, (320,), generator=generator)
    features = centers[labels] + torch.randn(320, 8, generator=generator)
    train = TensorDataset(features[:256], labels[:256])
    val = TensorDataset(features[256:], labels[256:])
    train_loader = DataLoader(
        train, batch_size=batch_size, shuffle=True, pin_memory=torch.cuda.is_available()
    )
    val_loader = DataLoader(val, batch_size=batch_size)
    return train_loader, val_loader


def compute_loss(net, criterion, x, y):
    # runs on each GPU's part of the batch
    loss = criterion(net(x), y)
    return loss


def train_step(net, optimizer, criterion, x, y):
    optimizer.zero_grad()
    loss_on_gpus = LossInForward(compute_loss, net, criterion)
    if next(net.parameters()).is_cuda:  # one replica per visible GPU
        loss_on_gpus = nn.DataParallel(loss_on_gpus)
    loss = loss_on_gpus(x, y).mean()  # mean of the per-GPU losses
    loss.backward()
    optimizer.step()
    return loss


def evaluate(net, loader, device):
    net.eval()
    correct = 0
    with torch.no_grad():
        for x, y in loader:
            correct += (net(x.to(device)).argmax(1) == y.to(device)).sum().item()
    net.train()
    return correct / len(loader.dataset)


def train_epoch(net, optimizer, criterion, loader, device):
    batches = loader
    for x, y in batches:
        train_step(
            net,
            optimizer,
            criterion,
            x.to(device, non_blocking=True),
            y.to(device, non_blocking=True),
        )


def main():
    parser = argparse.ArgumentParser(description="Training through helper functions")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=32)
    args = parser.parse_args()
    torch.manual_seed(0)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    net = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Dropout(0.1), nn.Linear(32, 4)).to(device)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    criterion = FocalLoss()
    train_loader, val_loader = make_loaders(args.batch_size)
    print(f"accuracy before training: {evaluate(net, val_loader, device):.3f}")
    for epoch in range(args.epochs):
        train_epoch(net, optimizer, criterion, train_loader, device)
        print(f"epoch {epoch}: accuracy {evaluate(net, val_loader, device):.3f}")
    torch.save(net.state_dict(), "step_functions.pt")


if __name__ == "__main__":
    main()
