"""Exercise 0.1: Shaped (1, 1, size, size)."""

from __future__ import annotations

import torch


def causal_mask(size: int) -> torch.Tensor:
    return torch.tril(torch.ones(size, size, dtype=torch.bool)).view(1, 1, size, size)  # Mistake: the shape
