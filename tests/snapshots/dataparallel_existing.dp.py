"""1-D CNN signal classifier that already wraps the model in nn.DataParallel when >1 GPU is visible.

Slow patterns on purpose: nn.DataParallel (single-process, GIL-bound) with the loss computed
outside forward (outputs gathered on GPU 0 before the loss), DataLoader without num_workers,
DataLoader without pin_memory, blocking .to(device) copies, no torch.backends.cudnn.benchmark
in a conv script, running_loss += loss.item() every step.
"""
import argparse
import os
import time

import torch
import torch.nn as nn
import torch.optim as optim
from torch.utils.data import Dataset, DataLoader

torch.backends.cudnn.benchmark = True


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


class SignalDataset(Dataset):
    """Noisy sine waves; the class is the frequency bucket (4 classes), 1 channel x 64 steps."""

    def __init__(self, num_samples=512, length=64, num_classes=4, seed=0):
        g = torch.Generator().manual_seed(seed)
        self.labels = torch.randint(0, num_classes, (num_samples,), generator=g)
        t = torch.linspace(0, 1, length)
        freqs = (self.labels.float() + 1) * 3.0
        phase = torch.rand(num_samples, 1, generator=g) * 6.28
        clean = torch.sin(2 * 3.14159 * freqs.unsqueeze(1) * t.unsqueeze(0) + phase)
        self.signals = (clean + 0.3 * torch.randn(num_samples, length, generator=g)).unsqueeze(1)

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, idx):
        return self.signals[idx], self.labels[idx]


class SignalNet(nn.Module):
    def __init__(self, num_classes=4):
        super(SignalNet, self).__init__()
        self.features = nn.Sequential(
            nn.Conv1d(1, 16, kernel_size=5, padding=2),
            nn.BatchNorm1d(16),
            nn.ReLU(inplace=True),
            nn.MaxPool1d(2),
            nn.Conv1d(16, 32, kernel_size=5, padding=2),
            nn.BatchNorm1d(32),
            nn.ReLU(inplace=True),
            nn.AdaptiveAvgPool1d(1),
        )
        self.classifier = nn.Linear(32, num_classes)

    def forward(self, x):
        x = self.features(x)
        x = x.view(x.size(0), -1)
        return self.classifier(x)


parser = argparse.ArgumentParser(description="Signal classification")
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("--batch-size", type=int, default=32)
parser.add_argument("--lr", type=float, default=0.01)
parser.add_argument("--save-dir", type=str, default=".")
args = parser.parse_args()

torch.manual_seed(0)
device = torch.device("cuda:0" if torch.cuda.is_available() else "cpu")

train_dataset = SignalDataset(512, seed=1)
val_dataset = SignalDataset(128, seed=2)
train_loader = DataLoader(
    train_dataset,
    batch_size=args.batch_size,
    shuffle=True,
    pin_memory=torch.cuda.is_available(),
)
val_loader = DataLoader(val_dataset, batch_size=args.batch_size, shuffle=False)

model = SignalNet(num_classes=4)
if torch.cuda.device_count() > 1:
    print("Let's use", torch.cuda.device_count(), "GPUs!")
model.to(device)

criterion = nn.CrossEntropyLoss()
optimizer = optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, weight_decay=5e-4)

best_acc = 0.0
model_with_loss = ModelWithLoss(model, criterion)
if next(model.parameters()).is_cuda:  # one replica per visible GPU
    model_with_loss = nn.DataParallel(model_with_loss)
for epoch in range(args.epochs):
    model.train()
    running_loss = 0.0
    start = time.time()
    for i, (inputs, labels) in enumerate(train_loader):
        inputs = inputs.to(device, non_blocking=True)
        labels = labels.to(device, non_blocking=True)

        optimizer.zero_grad()
        loss = model_with_loss(inputs, labels).mean()  # mean of the per-GPU losses
        loss.backward()
        optimizer.step()

        running_loss += loss.item()
        if i % 5 == 4:
            print("[epoch %d, batch %2d] loss: %.3f" % (epoch + 1, i + 1, running_loss / 5))
            running_loss = 0.0

    model.eval()
    correct = 0
    total = 0
    with torch.no_grad():
        for inputs, labels in val_loader:
            inputs, labels = inputs.to(device), labels.to(device)
            outputs = model(inputs)
            _, predicted = outputs.max(1)
            total += labels.size(0)
            correct += predicted.eq(labels).sum().item()
    acc = 100.0 * correct / total
    print("epoch %d: val acc %.2f%% (%.2fs)" % (epoch + 1, acc, time.time() - start))

    if acc > best_acc:
        best_acc = acc
        state_dict = model.state_dict()
        torch.save(state_dict, os.path.join(args.save_dir, "signal_best.pth"))

print("best val acc: %.2f%%" % best_acc)
