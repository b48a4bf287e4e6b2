"""autoaccel: make PyTorch training scripts fast without hand-work."""

__version__ = "0.1.0"
