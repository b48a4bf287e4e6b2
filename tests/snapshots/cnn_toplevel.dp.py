"""Small CNN image classifier written as plain top-level code (no functions).

Slow patterns on purpose: DataLoader without num_workers, DataLoader without pin_memory,
blocking .to(device) copies, no torch.backends.cudnn.benchmark in a conv script,
loss.item() every step, torch.zeros(n).to(device) CPU-then-move tensor creation.
"""
import torch
import torch.nn as nn
import torch.optim as optim
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


torch.backends.cudnn.benchmark = True

torch.manual_seed(0)

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
print("Using device:", device)

# ---- hyperparameters ----
num_classes = 10
num_epochs = 2
batch_size = 32
learning_rate = 0.01

# ---- fake image data (stand-in for a real dataset) ----
# every class gets its own "template" image, samples are template + noise
g = torch.Generator().manual_seed(1234)
templates = torch.randn(num_classes, 3, 16, 16, generator=g)

train_labels = torch.randint(0, num_classes, (256,), generator=g)
train_images = templates[train_labels] + 0.8 * torch.randn(256, 3, 16, 16, generator=g)
test_labels = torch.randint(0, num_classes, (64,), generator=g)
test_images = templates[test_labels] + 0.8 * torch.randn(64, 3, 16, 16, generator=g)

train_set = TensorDataset(train_images, train_labels)
test_set = TensorDataset(test_images, test_labels)

train_loader = DataLoader(
    train_set, batch_size=32, shuffle=True, pin_memory=torch.cuda.is_available()
)
test_loader = DataLoader(test_set, batch_size=32, shuffle=False)

# ---- model ----
model = nn.Sequential(
    nn.Conv2d(3, 16, kernel_size=3, padding=1),
    nn.BatchNorm2d(16),
    nn.ReLU(),
    nn.MaxPool2d(2),          # 16 -> 8
    nn.Conv2d(16, 32, kernel_size=3, padding=1),
    nn.BatchNorm2d(32),
    nn.ReLU(),
    nn.MaxPool2d(2),          # 8 -> 4
    nn.Flatten(),
    nn.Dropout(0.25),
    nn.Linear(32 * 4 * 4, 64),
    nn.ReLU(),
    nn.Linear(64, num_classes),
)
model = model.to(device)

criterion = nn.CrossEntropyLoss()
optimizer = optim.SGD(model.parameters(), lr=learning_rate, momentum=0.9)

# ---- training ----
model_with_loss = ModelWithLoss(model, criterion)
if next(model.parameters()).is_cuda:  # one replica per visible GPU
    model_with_loss = nn.DataParallel(model_with_loss)
for epoch in range(num_epochs):
    model.train()
    running_loss = 0.0
    for i, (images, labels) in enumerate(train_loader):
        images, labels = images.to(device, non_blocking=True), labels.to(
            device, non_blocking=True
        )

        optimizer.zero_grad()
        loss = model_with_loss(images, labels).mean()  # mean of the per-GPU losses
        loss.backward()
        optimizer.step()

        running_loss += loss.item()
        if (i + 1) % 4 == 0:
            print('[%d, %3d] loss: %.4f' % (epoch + 1, i + 1, running_loss / 4))
            running_loss = 0.0

print('Finished Training')

# ---- evaluation ----
model.eval()
correct = 0
total = 0
class_correct = torch.zeros(num_classes).to(device)
class_total = torch.zeros(num_classes).to(device)
with torch.no_grad():
    for images, labels in test_loader:
        images = images.to(device)
        labels = labels.to(device)
        outputs = model(images)
        _, predicted = torch.max(outputs.data, 1)
        total += labels.size(0)
        correct += (predicted == labels).sum().item()
        for c in range(num_classes):
            mask = labels == c
            class_correct[c] += (predicted[mask] == c).sum()
            class_total[c] += mask.sum()

print('Accuracy on the %d test images: %.1f %%' % (total, 100 * correct / total))
for c in range(num_classes):
    if class_total[c] > 0:
        print('  class %d: %.1f %%' % (c, 100 * class_correct[c].item() / class_total[c].item()))

torch.save(model.state_dict(), 'cnn_model.pth')
print('Saved model to cnn_model.pth')
