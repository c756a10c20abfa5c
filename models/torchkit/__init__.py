"""PyTorch-only training utilities: checkpoints with a safe loader, torch.distributed setup."""
