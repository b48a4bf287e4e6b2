"""`autoaccel convert`: rewrite a single-GPU training script into a fast one."""
