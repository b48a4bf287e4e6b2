"""A stand-in for tensorboardX, which is not installed here: each `SummaryWriter` writes
one text file per process (`events.<pid>` in its folder), a line per scalar."""

import os


class SummaryWriter:
    def __init__(self, log_dir="runs"):
        os.makedirs(log_dir, exist_ok=True)
        self.file = open(os.path.join(log_dir, f"events.{os.getpid()}"), "w")

    def add_scalar(self, tag, value, step):
        self.file.write(f"{tag} {step} {value:.4f}\n")

    def close(self):
        self.file.close()
