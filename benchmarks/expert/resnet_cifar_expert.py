"""`fixtures/resnet_cifar.py` as an expert would tune it by hand: the yardstick for
`autoaccel convert` (benchmarks/gpu_bench.py reports converted samples/s over these).

Same data, augmentation, model, optimiser, schedule and arguments as the fixture (imported
from it, so the work per sample is identical); what differs is how it is fed and run:
worker processes with pinned memory, persistent workers and a deeper prefetch queue,
asynchronous copies straight into channels_last, cuDNN autotuning and TF32, bf16 autocast,
a fused optimiser step, gradients set to None, no host sync in the training loop (losses and
accuracy accumulate on the device and are read when printed), and `--compile`.
"""
import argparse
import os
import sys
from pathlib import Path

import torch
import torch.nn as nn

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "fixtures"))
from resnet_cifar import SIZES, ResNet, SyntheticCIFAR  # noqa: E402


def loader(dataset, batch_size, cuda, **kwargs):
    workers = min(8, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 8)
    return torch.utils.data.DataLoader(
        dataset, batch_size=batch_size, num_workers=workers, pin_memory=cuda,
        persistent_workers=True, prefetch_factor=4, **kwargs,
    )


def main():
    parser = argparse.ArgumentParser(description="ResNet on synthetic CIFAR, tuned by hand")
    parser.add_argument("--size", choices=sorted(SIZES), default="tiny")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--log-interval", type=int, default=4)
    parser.add_argument("--compile", action="store_true")
    args = parser.parse_args()

    torch.manual_seed(0)
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    torch.backends.cudnn.benchmark = True
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    n_train, n_test, width, blocks, batch_size, blur_passes = SIZES[args.size]

    train_set = SyntheticCIFAR(n_train, seed=1, train=True, blur_passes=blur_passes)
    test_set = SyntheticCIFAR(n_test, seed=2, train=False, blur_passes=blur_passes)
    train_loader = loader(train_set, batch_size, cuda, shuffle=True, drop_last=True)
    test_loader = loader(test_set, batch_size, cuda)

    model = ResNet(width, blocks).to(device, memory_format=torch.channels_last)
    if args.compile:
        model.compile()
    criterion = nn.CrossEntropyLoss(label_smoothing=0.1)
    optimizer = torch.optim.SGD(
        model.parameters(), lr=args.lr, momentum=0.9, nesterov=True, weight_decay=5e-4,
        fused=cuda,
    )
    scheduler = torch.optim.lr_scheduler.OneCycleLR(
        optimizer, max_lr=args.lr, total_steps=args.epochs * len(train_loader)
    )

    for epoch in range(1, args.epochs + 1):
        model.train()
        running_loss = torch.zeros((), device=device)
        for step, (images, labels) in enumerate(train_loader, 1):
            images = images.to(device, non_blocking=True, memory_format=torch.channels_last)
            labels = labels.to(device, non_blocking=True)
            with torch.autocast(device.type, dtype=torch.bfloat16):
                loss = criterion(model(images), labels)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            scheduler.step()
            running_loss += loss.detach()
            if step % args.log_interval == 0:
                print(f"epoch {epoch} step {step}: loss {running_loss.item() / args.log_interval:.4f}")
                running_loss.zero_()

        model.eval()
        correct = torch.zeros((), dtype=torch.long, device=device)
        with torch.no_grad(), torch.autocast(device.type, dtype=torch.bfloat16):
            for images, labels in test_loader:
                images = images.to(device, non_blocking=True, memory_format=torch.channels_last)
                labels = labels.to(device, non_blocking=True)
                correct += (model(images).argmax(1) == labels).sum()
        print(f"epoch {epoch}: test accuracy {100.0 * correct.item() / len(test_set):.1f}%")

    torch.save(model.state_dict(), "resnet_cifar.pt")


if __name__ == "__main__":
    main()
