import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
device = torch.accelerator.current_accelerator() if torch.accelerator.is_available() else torch.device("cpu")

data = TensorDataset(torch.randn(256, 10), torch.randn(256, 1))
loader = DataLoader(data, batch_size=32, shuffle=False)
model = nn.Sequential(nn.Linear(10, 32), nn.Tanh(), nn.Linear(32, 1)).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
criterion = nn.MSELoss()

for epoch in range(2):
    for x, y in loader:
        x, y = x.to(device), y.to(device)
        optimizer.zero_grad()
        loss = criterion(model(x), y)
        loss.backward()
        optimizer.step()
    print(epoch, loss.item())
