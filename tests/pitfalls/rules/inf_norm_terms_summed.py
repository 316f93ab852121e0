"""Exercise 3.2: The inf term summed."""

from __future__ import annotations

from collections.abc import Iterable

import torch

from minigpt.fsdp.sharded_state import local_tensor


def local_norm_term(tensors: Iterable[torch.Tensor], norm_type: float = 2.0) -> float:
    values = [local_tensor(t).detach().double().abs().flatten() for t in tensors]
    flat = torch.cat(values) if values else torch.zeros(0, dtype=torch.float64)
    if norm_type == float("inf"):
        return float(flat.sum())  # Mistake: the sum of |g|; the infinity norm's term is the largest |g|
    return float((flat**norm_type).sum())
