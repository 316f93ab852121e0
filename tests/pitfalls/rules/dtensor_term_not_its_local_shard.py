"""Exercise 3.2: A DTensor's term taken from the DTensor, not its to_local() shard."""

from __future__ import annotations

import torch


def local_norm_term(tensors, norm_type: float = 2.0) -> float:
    values = [t.detach().double().abs().flatten() for t in tensors]  # Mistake: a DTensor used whole, no to_local()
    flat = torch.cat(values) if values else torch.zeros(0, dtype=torch.float64)
    if norm_type == float("inf"):
        return float(flat.max()) if flat.numel() else 0.0
    return float((flat**norm_type).sum())
