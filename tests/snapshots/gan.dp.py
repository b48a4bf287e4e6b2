"""Tiny MLP GAN learning a 2-D ring of Gaussians, in the style of pytorch/examples dcgan.

Slow patterns on purpose: several .item() calls every step (errD, errG, D(x), D(G(z))),
torch.ones(b).to(device) / torch.zeros(b).to(device) CPU-then-move label tensors every step,
DataLoader without num_workers, DataLoader without pin_memory, blocking .to(device) copies,
fixed_noise samples moved back with .cpu() for logging.
"""
import argparse
import math

import torch
import torch.nn as nn
import torch.optim as optim
from torch.utils.data import Dataset, DataLoader

parser = argparse.ArgumentParser()
parser.add_argument('--batchSize', type=int, default=64, help='input batch size')
parser.add_argument('--nz', type=int, default=8, help='size of the latent z vector')
parser.add_argument('--ngf', type=int, default=64)
parser.add_argument('--ndf', type=int, default=64)
parser.add_argument('--epochs', type=int, default=2, help='number of epochs to train for')
parser.add_argument('--lr', type=float, default=0.0005, help='learning rate, default=0.0005')
parser.add_argument('--beta1', type=float, default=0.5, help='beta1 for adam. default=0.5')
parser.add_argument('--cuda', action='store_true', default=False, help='enables cuda')
parser.add_argument('--outf', default='.', help='folder to output model checkpoints')
parser.add_argument('--manualSeed', type=int, default=999, help='manual seed')
opt = parser.parse_args()
print(opt)

print("Random Seed: ", opt.manualSeed)
torch.manual_seed(opt.manualSeed)

if torch.cuda.is_available() and not opt.cuda:
    print("WARNING: You have a CUDA device, so you should probably run with --cuda")

device = torch.device("cuda:0" if opt.cuda and torch.cuda.is_available() else "cpu")
nz = opt.nz
ngf = opt.ngf
ndf = opt.ndf


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


class RingDataset(Dataset):
    """'Real' data: points from 8 Gaussians arranged on a circle of radius 2."""

    def __init__(self, n=1024, seed=0):
        g = torch.Generator().manual_seed(seed)
        modes = torch.randint(0, 8, (n,), generator=g).float()
        angles = modes * (2 * math.pi / 8)
        centers = torch.stack([2 * torch.cos(angles), 2 * torch.sin(angles)], dim=1)
        self.points = centers + 0.05 * torch.randn(n, 2, generator=g)

    def __len__(self):
        return len(self.points)

    def __getitem__(self, idx):
        return self.points[idx]


dataset = RingDataset(1024, seed=opt.manualSeed)
dataloader = DataLoader(
    dataset,
    batch_size=opt.batchSize,
    shuffle=True,
    pin_memory=torch.cuda.is_available(),
)


# custom weights initialization called on netG and netD
def weights_init(m):
    classname = m.__class__.__name__
    if classname.find('Linear') != -1:
        nn.init.normal_(m.weight, 0.0, 0.1)
        nn.init.zeros_(m.bias)


class Generator(nn.Module):
    def __init__(self):
        super(Generator, self).__init__()
        self.main = nn.Sequential(
            nn.Linear(nz, ngf),
            nn.ReLU(True),
            nn.Linear(ngf, ngf),
            nn.ReLU(True),
            nn.Linear(ngf, 2),
        )

    def forward(self, input):
        return self.main(input)


class Discriminator(nn.Module):
    def __init__(self):
        super(Discriminator, self).__init__()
        self.main = nn.Sequential(
            nn.Linear(2, ndf),
            nn.LeakyReLU(0.2, inplace=True),
            nn.Linear(ndf, ndf),
            nn.LeakyReLU(0.2, inplace=True),
            nn.Linear(ndf, 1),
            nn.Sigmoid(),
        )

    def forward(self, input):
        return self.main(input).view(-1)


netG = Generator().to(device)
netG.apply(weights_init)
print(netG)

netD = Discriminator().to(device)
netD.apply(weights_init)
print(netD)

criterion = nn.BCELoss()

fixed_noise = torch.randn(16, nz, device=device)
real_label = 1.
fake_label = 0.

# setup optimizer
optimizerD = optim.Adam(netD.parameters(), lr=opt.lr, betas=(opt.beta1, 0.999))
optimizerG = optim.Adam(netG.parameters(), lr=opt.lr, betas=(opt.beta1, 0.999))

G_losses = []
D_losses = []


def compute_errD_real(netD, criterion, real_cpu, label):
    # runs on each GPU's part of the batch
    output = netD(real_cpu)
    errD_real = criterion(output, label)
    return errD_real, output


errD_real_on_gpus = LossInForward(compute_errD_real, netD, criterion)
if next(netD.parameters()).is_cuda:  # one replica per visible GPU
    errD_real_on_gpus = nn.DataParallel(errD_real_on_gpus)


def compute_errD_fake(netG, netD, criterion, noise, label):
    # runs on each GPU's part of the batch
    fake = netG(noise)
    output = netD(fake.detach())
    errD_fake = criterion(output, label)
    return errD_fake, fake, output


errD_fake_on_gpus = LossInForward(compute_errD_fake, netG, netD, criterion)
if next(netG.parameters()).is_cuda:  # one replica per visible GPU
    errD_fake_on_gpus = nn.DataParallel(errD_fake_on_gpus)


def compute_errG(netD, criterion, fake, label):
    # runs on each GPU's part of the batch
    output = netD(fake)
    errG = criterion(output, label)
    return errG, output


errG_on_gpus = LossInForward(compute_errG, netD, criterion)
if next(netD.parameters()).is_cuda:  # one replica per visible GPU
    errG_on_gpus = nn.DataParallel(errG_on_gpus)

for epoch in range(opt.epochs):
    for i, data in enumerate(dataloader, 0):
        ############################
        # (1) Update D network: maximize log(D(x)) + log(1 - D(G(z)))
        ###########################
        # train with real
        netD.zero_grad()
        real_cpu = data.to(device, non_blocking=True)
        batch_size = real_cpu.size(0)
        label = torch.ones(batch_size, device=device)

        errD_real, output = errD_real_on_gpus(real_cpu, label)
        errD_real = errD_real.mean()  # mean of the per-GPU losses
        errD_real.backward()
        D_x = output.mean().item()

        # train with fake
        noise = torch.randn(batch_size, nz, device=device)
        label = torch.zeros(batch_size, device=device)
        errD_fake, fake, output = errD_fake_on_gpus(noise, label)
        errD_fake = errD_fake.mean()  # mean of the per-GPU losses
        errD_fake.backward()
        D_G_z1 = output.mean().item()
        errD = errD_real + errD_fake
        optimizerD.step()

        ############################
        # (2) Update G network: maximize log(D(G(z)))
        ###########################
        netG.zero_grad()
        label = torch.ones(
            batch_size, device=device
        )  # fake labels are real for generator cost
        errG, output = errG_on_gpus(fake, label)
        errG = errG.mean()  # mean of the per-GPU losses
        errG.backward()
        D_G_z2 = output.mean().item()
        optimizerG.step()

        G_losses.append(errG.item())
        D_losses.append(errD.item())

        if i % 4 == 0:
            print('[%d/%d][%d/%d] Loss_D: %.4f Loss_G: %.4f D(x): %.4f D(G(z)): %.4f / %.4f'
                  % (epoch, opt.epochs, i, len(dataloader),
                     errD.item(), errG.item(), D_x, D_G_z1, D_G_z2))

    with torch.no_grad():
        samples = netG(fixed_noise).cpu()
    radius = samples.norm(dim=1)
    print('epoch %d: fixed_noise sample radius mean %.3f std %.3f'
          % (epoch, radius.mean().item(), radius.std().item()))

    # do checkpointing
    torch.save(netG.state_dict(), '%s/netG_epoch_%d.pth' % (opt.outf, epoch))
    torch.save(netD.state_dict(), '%s/netD_epoch_%d.pth' % (opt.outf, epoch))
