"""Tiny MLP GAN learning a 2-D ring of Gaussians, in the style of pytorch/examples dcgan.

Slow patterns on purpose: several .item() calls every step (errD, errG, D(x), D(G(z))),
torch.ones(b).to(device) / torch.zeros(b).to(device) CPU-then-move label tensors every step,
DataLoader without num_workers, DataLoader without pin_memory, blocking .to(device) copies,
fixed_noise samples moved back with .cpu() for logging.
"""
import argparse
import gc
import math
import os
import warnings

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.optim as optim
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import Dataset, DataLoader
from torch.utils.data.distributed import DistributedSampler

# Distributed training: torchrun starts one process per GPU and sets RANK, LOCAL_RANK
# and WORLD_SIZE. Run with plain `python`, the script is a single process, as before.
DISTRIBUTED = "LOCAL_RANK" in os.environ
RANK = int(os.environ.get("RANK", 0))
LOCAL_RANK = int(os.environ.get("LOCAL_RANK", 0))
WORLD_SIZE = int(os.environ.get("WORLD_SIZE", 1))
if DISTRIBUTED:
    if torch.cuda.is_available():
        torch.cuda.set_device(LOCAL_RANK)  # "cuda" now means this process's GPU
    # nccl for CUDA tensors, gloo for CPU tensors
    backend = "cpu:gloo,cuda:nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend, init_method="env://")


def per_process_batch_size(global_batch_size):
    """Each process loads an equal share of the original (global) batch."""
    share = max(1, global_batch_size // WORLD_SIZE)
    if global_batch_size % WORLD_SIZE:
        warnings.warn(
            f"batch size {global_batch_size} does not divide by {WORLD_SIZE} processes:"
            f" each loads {share}, {share * WORLD_SIZE} in all; give a batch size that"
            f" divides by {WORLD_SIZE} to keep the global batch"
        )
    return share


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
if RANK == 0:
    print(opt)

    print("Random Seed: ", opt.manualSeed)
torch.manual_seed(opt.manualSeed)

if torch.cuda.is_available() and not opt.cuda:
    if RANK == 0:
        print("WARNING: You have a CUDA device, so you should probably run with --cuda")

device = torch.device("cuda" if opt.cuda and torch.cuda.is_available() else "cpu")
nz = opt.nz
ngf = opt.ngf
ndf = opt.ndf


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
sampler = DistributedSampler(dataset, shuffle=True) if DISTRIBUTED else None
dataloader = DataLoader(
    dataset,
    batch_size=per_process_batch_size(opt.batchSize),
    shuffle=sampler is None,
    pin_memory=torch.cuda.is_available(),
    sampler=sampler,
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
# trained through DDP when distributed: gradients are averaged in backward()
ddp_netG = netG
if DISTRIBUTED:
    ddp_netG = DDP(
        netG, device_ids=[LOCAL_RANK] if next(netG.parameters()).is_cuda else None
    )
if RANK == 0:
    print(netG)

netD = Discriminator().to(device)
netD.apply(weights_init)
# trained through DDP when distributed: gradients are averaged in backward()
ddp_netD = netD
if DISTRIBUTED:
    ddp_netD = DDP(
        netD, device_ids=[LOCAL_RANK] if next(netD.parameters()).is_cuda else None
    )
if RANK == 0:
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

# Same model and data on every process so far; from here each draws its own random
# numbers (noise, dropout, augmentation), as the GPUs of one big batch would.
if DISTRIBUTED:
    torch.manual_seed(torch.initial_seed() + RANK)
for epoch in range(opt.epochs):
    if DISTRIBUTED:
        dataloader.sampler.set_epoch(epoch)
    for i, data in enumerate(dataloader, 0):
        ############################
        # (1) Update D network: maximize log(D(x)) + log(1 - D(G(z)))
        ###########################
        # train with real
        netD.zero_grad()
        real_cpu = data.to(device, non_blocking=True)
        batch_size = real_cpu.size(0)
        label = torch.ones(batch_size, device=device)

        output = ddp_netD(real_cpu)
        errD_real = criterion(output, label)
        errD_real.backward()
        D_x = output.mean().item()

        # train with fake
        noise = torch.randn(batch_size, nz, device=device)
        fake = ddp_netG(noise)
        label = torch.zeros(batch_size, device=device)
        output = ddp_netD(fake.detach())
        errD_fake = criterion(output, label)
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
        output = ddp_netD(fake)
        errG = criterion(output, label)
        errG.backward()
        D_G_z2 = output.mean().item()
        optimizerG.step()

        G_losses.append(errG.item())
        D_losses.append(errD.item())

        if i % 4 == 0:
            if RANK == 0:
                print(
                    '[%d/%d][%d/%d] Loss_D: %.4f Loss_G: %.4f D(x): %.4f D(G(z)): %.4f / %.4f'
                    % (
                        epoch,
                        opt.epochs,
                        i,
                        len(dataloader),
                        errD.item(),
                        errG.item(),
                        D_x,
                        D_G_z1,
                        D_G_z2,
                    )
                )

    with torch.no_grad():
        samples = netG(fixed_noise).cpu()
    radius = samples.norm(dim=1)
    if RANK == 0:
        print('epoch %d: fixed_noise sample radius mean %.3f std %.3f'
              % (epoch, radius.mean().item(), radius.std().item()))

        # do checkpointing
        torch.save(netG.state_dict(), '%s/netG_epoch_%d.pth' % (opt.outf, epoch))
        torch.save(netD.state_dict(), '%s/netD_epoch_%d.pth' % (opt.outf, epoch))

if DISTRIBUTED:
    # free the models first: left to the exit, they can abort the process
    del ddp_netG, ddp_netD
    gc.collect()
    dist.destroy_process_group()
