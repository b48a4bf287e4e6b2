"""`autoaccel tune`: find the fastest DataLoader settings by timing the script's own loaders."""
