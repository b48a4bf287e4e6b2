"""Small MLP regression with a fixed seed and unshuffled data, used to check exact equivalence.

Slow patterns on purpose: DataLoader without num_workers, DataLoader without pin_memory,
blocking .to(device) copies, loss.item() every step, torch.zeros(n).to(device)
CPU-then-move tensor creation for the per-epoch loss history.
(No dropout, no BatchNorm, shuffle=False, 512 samples = 4 * 4 * batch_size: results
must be bit-for-bit reproducible so a converted script can be compared parameter by parameter.)
"""
import argparse

import torch
import torch.nn as nn
from torch.utils.data import TensorDataset, DataLoader


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


parser = argparse.ArgumentParser(description="MLP regression (deterministic)")
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("--batch-size", type=int, default=32)
parser.add_argument("--lr", type=float, default=0.05)
parser.add_argument("--seed", type=int, default=0)
parser.add_argument("--save-params", type=str, default=None,
                    help="where to torch.save the final state_dict")
args = parser.parse_args()

torch.manual_seed(args.seed)
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")

# ----- synthetic regression problem: y = sin(x . a) + x . b + noise -----
n_samples, n_features = 512, 8
g = torch.Generator().manual_seed(1234)
X = torch.randn(n_samples, n_features, generator=g)
a = torch.randn(n_features, generator=g) / n_features ** 0.5
b = torch.randn(n_features, generator=g) / n_features ** 0.5
y = (torch.sin(X @ a) + X @ b + 0.05 * torch.randn(n_samples, generator=g)).unsqueeze(1)

dataset = TensorDataset(X, y)
loader = DataLoader(
    dataset,
    batch_size=args.batch_size,
    shuffle=False,
    pin_memory=torch.cuda.is_available(),
)

model = nn.Sequential(
    nn.Linear(n_features, 32),
    nn.Tanh(),
    nn.Linear(32, 32),
    nn.Tanh(),
    nn.Linear(32, 1),
).to(device)

criterion = nn.MSELoss()
optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)

epoch_losses = torch.zeros(args.epochs).to(device)
model_with_loss = ModelWithLoss(model, criterion)
if next(model.parameters()).is_cuda:  # one replica per visible GPU
    model_with_loss = nn.DataParallel(model_with_loss)
for epoch in range(args.epochs):
    model.train()
    running = 0.0
    for step, (xb, yb) in enumerate(loader):
        xb = xb.to(device, non_blocking=True)
        yb = yb.to(device, non_blocking=True)

        optimizer.zero_grad()
        loss = model_with_loss(xb, yb).mean()  # mean of the per-GPU losses
        loss.backward()
        optimizer.step()

        running += loss.item()
        if step % 4 == 0:
            print(f"epoch {epoch} step {step:2d} loss {loss.item():.6f}")
    epoch_losses[epoch] = running / len(loader)
    print(f"epoch {epoch} mean loss {epoch_losses[epoch].item():.6f}")

print("loss history:", [round(v, 6) for v in epoch_losses.tolist()])

if args.save_params:
    torch.save(model.state_dict(), args.save_params)
    print(f"saved parameters to {args.save_params}")
