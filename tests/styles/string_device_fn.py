import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset


def train_one_epoch(model, loader, optimizer, device):
    model.train()
    for inputs, targets in loader:
        inputs = inputs.to(device)
        targets = targets.to(device)
        optimizer.zero_grad()
        logits = model(inputs)
        loss = F.cross_entropy(logits, targets)
        loss.backward()
        optimizer.step()


def evaluate(model, loader, device):
    model.eval()
    correct = 0
    for inputs, targets in loader:
        inputs, targets = inputs.to(device), targets.to(device)
        correct += (model(inputs).argmax(1) == targets).sum().item()
    return correct / len(loader.dataset)


def main():
    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    data = TensorDataset(torch.randn(256, 12), torch.randint(0, 3, (256,)))
    train_loader = DataLoader(data, batch_size=32)
    model = nn.Sequential(nn.Linear(12, 24), nn.ReLU(), nn.Linear(24, 3)).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    for epoch in range(2):
        train_one_epoch(model, train_loader, optimizer, device)
        print(epoch, evaluate(model, train_loader, device))


if __name__ == "__main__":
    main()
