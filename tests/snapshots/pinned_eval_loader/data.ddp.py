import os
import warnings

import torch
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

# Distributed training: torchrun sets RANK, LOCAL_RANK and WORLD_SIZE, and the script
# that imports this module starts the process group. Without torchrun: one process.
DISTRIBUTED = "LOCAL_RANK" in os.environ
RANK = int(os.environ.get("RANK", 0))
LOCAL_RANK = int(os.environ.get("LOCAL_RANK", 0))
WORLD_SIZE = int(os.environ.get("WORLD_SIZE", 1))


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


def get_loader(batch_size=16):
    data = TensorDataset(torch.randn(128, 4), torch.randn(128, 1))
    sampler = DistributedSampler(data, shuffle=True) if DISTRIBUTED else None
    return DataLoader(
        data,
        batch_size=per_process_batch_size(batch_size),
        shuffle=sampler is None,
        pin_memory=torch.cuda.is_available(),
        sampler=sampler,
    )
