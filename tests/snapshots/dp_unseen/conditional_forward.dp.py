"""A conditional VAE whose forward pass is picked by a flag of the command line:
`if args.conditional: out = vae(x, y) else: out = vae(x)`, then the loss (the shape of a
public CVAE, written anew). Both branches are per-sample forwards of the same batch, so
the `if` moves into the compute function whole and each GPU takes the branch the flag
picks. The latent code is the mean (no sampling), so that the losses of the two halves
of a batch add up to those of the whole batch exactly."""
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


class VAE(nn.Module):
    def __init__(self, labels):
        super().__init__()
        self.labels = labels
        self.encoder = nn.Linear(16 + labels, 8)
        self.decoder = nn.Linear(4 + labels, 16)

    def forward(self, x, y=None):
        c = F.one_hot(y, self.labels).float() if y is not None else x.new_zeros(len(x), self.labels)
        mean, log_var = self.encoder(torch.cat([x, c], dim=1)).chunk(2, dim=1)
        recon = torch.sigmoid(self.decoder(torch.cat([mean, c], dim=1)))
        return recon, mean, log_var


def loss_fn(recon, x, mean, log_var):
    bce = F.binary_cross_entropy(recon, x, reduction="sum")
    kld = -0.5 * torch.sum(1 + log_var - mean.pow(2) - log_var.exp())
    return (bce + kld) / x.size(0)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--conditional", action=argparse.BooleanOptionalAction, default=True)
    args = parser.parse_args()
    torch.manual_seed(0)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    data = TensorDataset(torch.rand(96, 16), torch.randint(0, 3, (96,)))
    loader = DataLoader(
        data, batch_size=16, shuffle=True, pin_memory=torch.cuda.is_available()
    )
    vae = VAE(3).to(device)
    optimizer = torch.optim.Adam(vae.parameters(), lr=0.01)

    def compute_loss(vae, x, y):
        # runs on each GPU's part of the batch
        if args.conditional:
            recon, mean, log_var = vae(x, y)
        else:
            recon, mean, log_var = vae(x)
        loss = loss_fn(recon, x, mean, log_var)
        return loss

    loss_on_gpus = LossInForward(compute_loss, vae)
    if next(vae.parameters()).is_cuda:  # one replica per visible GPU
        loss_on_gpus = nn.DataParallel(loss_on_gpus)
    for epoch in range(2):
        for x, y in loader:
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            loss = loss_on_gpus(x, y).mean()  # mean of the per-GPU losses
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        print(f"epoch {epoch}: loss {loss.item():.4f}")
