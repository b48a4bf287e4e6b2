"""A stand-in for tensorboardX, which is not installed here: each `SummaryWriter` writes
one text file per process (`events.<pid>` in its folder), a line per scalar. Without a
folder it makes one of its own, as the real one names it after the time and host: here
after the process, so that two processes never agree by chance."""

import os


class SummaryWriter:
    def __init__(self, log_dir=None):
        if log_dir is None:
            log_dir = os.path.join("runs", f"process{os.getpid()}")
        self.log_dir = self.logdir = log_dir
        os.makedirs(log_dir, exist_ok=True)
        self.file = open(os.path.join(log_dir, f"events.{os.getpid()}"), "w")

    def add_scalar(self, tag, value, step):
        self.file.write(f"{tag} {step} {value:.4f}\n")

    def close(self):
        self.file.close()
