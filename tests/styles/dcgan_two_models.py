"""Tiny convolutional GAN in the style of PyTorch-GAN's dcgan: two models, one BCE loss.

The generator's output feeds the discriminator inside the loss call
(`adversarial_loss(discriminator(gen_imgs), valid)`), and each epoch ends with a
validation loss of the discriminator computed after its forward pass. Autocast that
wraps only the generator hands the discriminator a bfloat16 image outside the region
(`RuntimeError: Input type (c10::BFloat16) and bias type (float)` in the real dcgan).
No shuffle, and the noise comes from a generator of its own, so the global random stream
that persistent DataLoader workers draw from less often changes nothing.
"""
import argparse

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

parser = argparse.ArgumentParser()
parser.add_argument("--n_epochs", type=int, default=2)
parser.add_argument("--batch_size", type=int, default=16)
parser.add_argument("--latent_dim", type=int, default=8)
parser.add_argument("--lr", type=float, default=0.0002)
opt = parser.parse_args()

torch.manual_seed(0)
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def blobs(n, seed):
    """'Real' 1x8x8 images: a bright square at a random place on a dark background."""
    g = torch.Generator().manual_seed(seed)
    images = torch.full((n, 1, 8, 8), -1.0)
    corners = torch.randint(0, 5, (n, 2), generator=g)
    for image, (row, col) in zip(images, corners.tolist()):
        image[:, row : row + 4, col : col + 4] = 1.0
    return images + 0.05 * torch.randn(n, 1, 8, 8, generator=g)


class Generator(nn.Module):
    def __init__(self):
        super().__init__()
        self.l1 = nn.Linear(opt.latent_dim, 16 * 4 * 4)
        self.conv_blocks = nn.Sequential(
            nn.BatchNorm2d(16),
            nn.Upsample(scale_factor=2),
            nn.Conv2d(16, 8, 3, stride=1, padding=1),
            nn.LeakyReLU(0.2, inplace=True),
            nn.Conv2d(8, 1, 3, stride=1, padding=1),
            nn.Tanh(),
        )

    def forward(self, z):
        out = self.l1(z).view(z.shape[0], 16, 4, 4)
        return self.conv_blocks(out)


class Discriminator(nn.Module):
    def __init__(self):
        super().__init__()
        self.model = nn.Sequential(
            nn.Conv2d(1, 8, 3, 2, 1),
            nn.LeakyReLU(0.2, inplace=True),
            nn.Conv2d(8, 16, 3, 2, 1),
            nn.LeakyReLU(0.2, inplace=True),
        )
        self.adv_layer = nn.Sequential(nn.Linear(16 * 2 * 2, 1), nn.Sigmoid())

    def forward(self, img):
        out = self.model(img)
        return self.adv_layer(out.view(out.shape[0], -1))


adversarial_loss = nn.BCELoss()
generator = Generator().to(device)
discriminator = Discriminator().to(device)

dataloader = DataLoader(TensorDataset(blobs(128, 1)), batch_size=opt.batch_size)
val_loader = DataLoader(TensorDataset(blobs(32, 2)), batch_size=opt.batch_size)

optimizer_G = torch.optim.Adam(generator.parameters(), lr=opt.lr, betas=(0.5, 0.999))
optimizer_D = torch.optim.Adam(discriminator.parameters(), lr=opt.lr, betas=(0.5, 0.999))
noise = torch.Generator(device=device).manual_seed(1)

for epoch in range(opt.n_epochs):
    for i, (imgs,) in enumerate(dataloader):
        valid = torch.ones(imgs.shape[0], 1, device=device)
        fake = torch.zeros(imgs.shape[0], 1, device=device)
        real_imgs = imgs.to(device)

        # Train the generator
        optimizer_G.zero_grad()
        z = torch.randn(imgs.shape[0], opt.latent_dim, device=device, generator=noise)
        gen_imgs = generator(z)
        g_loss = adversarial_loss(discriminator(gen_imgs), valid)
        g_loss.backward()
        optimizer_G.step()

        # Train the discriminator
        optimizer_D.zero_grad()
        real_loss = adversarial_loss(discriminator(real_imgs), valid)
        fake_loss = adversarial_loss(discriminator(gen_imgs.detach()), fake)
        d_loss = (real_loss + fake_loss) / 2
        d_loss.backward()
        optimizer_D.step()

        print(f"[Epoch {epoch}/{opt.n_epochs}] [Batch {i}/{len(dataloader)}] "
              f"[D loss: {d_loss.item():.4f}] [G loss: {g_loss.item():.4f}]")

    discriminator.eval()
    val_loss = 0.0
    with torch.no_grad():
        for (imgs,) in val_loader:
            validity = discriminator(imgs.to(device))
            val_loss += nn.functional.mse_loss(validity, torch.ones_like(validity)).item()
    discriminator.train()
    print(f"epoch {epoch}: val_loss {val_loss / len(val_loader):.6f}")
