"""The training loop and its parts: optimiser and LR rules, metrics, checkpoints, workers."""
