"""Regression on synthetic data, trained by a Trainer whose step is spread over methods.

The shape of pytorch/examples' distributed/ddp-tutorial-series/single_gpu.py (written
anew here): `train()` loops over epochs and calls `_run_epoch(epoch)`, which loops over
the loader and calls `_run_batch(x, y)`, where the forward pass, the loss and
`backward()` are. The DataLoader is built by a helper function and the objects by
another. The maintainers' own multigpu_torchrun.py shows the expected DDP version:
the model wrapped in `Trainer.__init__`, a DistributedSampler on the loader,
`set_epoch` every epoch, the checkpoint written by rank 0 only.

Slow patterns on purpose: DataLoader without num_workers, blocking `.to()` copies.
"""
import argparse

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset


class LossInForward(torch.nn.Module):
    """A model and its loss in one `forward`: under `nn.DataParallel` each GPU runs
    `compute` on its part of the batch (every tensor argument split along
    dimension 0) and only the losses (one per GPU) are gathered, instead of every
    output on GPU 0. `modules`, the models and losses `compute` calls, are
    replicated to every GPU and passed to it first."""

    def __init__(self, compute, *modules):
        super().__init__()
        self.compute = compute
        self.parts = torch.nn.ModuleList(modules)

    def forward(self, *batch):
        returned = self.compute(*self.parts, *batch)  # the loss, or (loss, *kept)
        if isinstance(returned, tuple):
            return (returned[0].unsqueeze(0), *returned[1:])
        return returned.unsqueeze(0)


class NoisyLinearData(Dataset):
    """`y = x @ w + noise` for 20 features."""

    def __init__(self, size):
        generator = torch.Generator().manual_seed(0)
        self.x = torch.randn(size, 20, generator=generator)
        w = torch.randn(20, 1, generator=generator)
        self.y = self.x @ w + 0.1 * torch.randn(size, 1, generator=generator)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, index):
        return self.x[index], self.y[index]


def compute_loss(model, source, targets):
    # runs on each GPU's part of the batch
    output = model(source)
    loss = F.mse_loss(output, targets)
    return loss


class Trainer:
    def __init__(self, model, train_data, optimizer, device, save_every):
        self.device = device
        self.model = model.to(device)
        self.loss_on_gpus = LossInForward(compute_loss, self.model)
        if next(self.model.parameters()).is_cuda:  # one replica per visible GPU
            self.loss_on_gpus = torch.nn.DataParallel(self.loss_on_gpus)
        self.train_data = train_data
        self.optimizer = optimizer
        self.save_every = save_every

    def _run_batch(self, source, targets):
        self.optimizer.zero_grad()
        loss = self.loss_on_gpus(source, targets).mean()  # mean of the per-GPU losses
        loss.backward()
        self.optimizer.step()

    def _run_epoch(self, epoch):
        print(f"Epoch {epoch} | Steps: {len(self.train_data)}")
        for source, targets in self.train_data:
            source = source.to(self.device, non_blocking=True)
            targets = targets.to(self.device, non_blocking=True)
            self._run_batch(source, targets)

    def _save_checkpoint(self, epoch):
        torch.save(self.model.state_dict(), "trainer_methods.pt")
        print(f"Epoch {epoch} | checkpoint saved")

    def train(self, max_epochs):
        for epoch in range(max_epochs):
            self._run_epoch(epoch)
            if epoch % self.save_every == 0:
                self._save_checkpoint(epoch)


def load_train_objs():
    train_set = NoisyLinearData(256)
    model = torch.nn.Sequential(torch.nn.Linear(20, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    return train_set, model, optimizer


def prepare_dataloader(dataset, batch_size):
    return DataLoader(
        dataset,
        batch_size=batch_size,
        shuffle=True,
        pin_memory=torch.cuda.is_available(),
    )


def main(device, total_epochs, save_every, batch_size):
    torch.manual_seed(0)
    dataset, model, optimizer = load_train_objs()
    train_data = prepare_dataloader(dataset, batch_size)
    trainer = Trainer(model, train_data, optimizer, device, save_every)
    trainer.train(total_epochs)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="Trainer with a step spread over methods")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--save-every", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=32)
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    main(device, args.epochs, args.save_every, args.batch_size)
