import torch
from torch import nn, optim
from torch.utils import data


class Learner:
    def __init__(self, use_cuda):
        self.use_cuda = use_cuda
        self.net = nn.Sequential(nn.Conv1d(2, 8, 3), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 14, 2))
        if use_cuda:
            self.net.cuda()
        self.opt = optim.SGD(self.net.parameters(), lr=0.1, momentum=0.9)
        self.loss_fn = nn.CrossEntropyLoss()
        ds = data.TensorDataset(torch.randn(128, 2, 16), torch.randint(0, 2, (128,)))
        self.loader = data.DataLoader(ds, batch_size=16, num_workers=0)

    def fit(self, epochs):
        for epoch in range(epochs):
            for x, y in self.loader:
                if self.use_cuda:
                    x, y = x.cuda(), y.cuda()
                self.opt.zero_grad()
                out = self.net(x)
                loss = self.loss_fn(out, y)
                loss.backward()
                self.opt.step()


if __name__ == "__main__":
    torch.manual_seed(0)
    Learner(torch.cuda.is_available()).fit(2)
