"""Exercise 5.1: An uneven cut, no ValueError."""

from __future__ import annotations

import torch


def row_slice(weight: torch.Tensor, bias: torch.Tensor | None, tp: int, rank: int):
    per = weight.shape[1] // tp
    stop = weight.shape[1] if rank == tp - 1 else (rank + 1) * per  # Mistake: uneven cut, no ValueError
    return weight[:, rank * per : stop].clone(), None if bias is None else bias.detach().clone()
