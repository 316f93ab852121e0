"""Exercise 0.1: 1.0 / 0.0 floats, not a torch.bool mask: the model's ~mask then fails too."""

from __future__ import annotations

import torch


def causal_mask(size: int) -> torch.Tensor:
    return torch.tril(torch.ones(size, size))  # Mistake: floats; the rule is a (size, size) torch.bool
