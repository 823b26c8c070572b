"""The training loop around a method: data, evaluation, logging, checkpoints."""
