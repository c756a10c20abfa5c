"""Training utilities shared by the model packages: checkpoints, metrics, distributed setup, progress, plots."""
