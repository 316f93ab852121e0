"""A third stated rule broken at a time (tests/test_grader.py grades this folder as it grades
tests/pitfalls/one_rule_each/: each test with only its own exercise the pitfall's).

Lab 00: the causal mask returned as 1.0 / 0.0 floats instead of a ``torch.bool`` tensor (0.1); a
batch that does not split refused with a message that names the batch but not the world size (0.3);
the cosine computed with torch, so the learning rate comes back as a tensor, not a Python float (0.4).
"""

from __future__ import annotations

import torch


def causal_mask(size: int) -> torch.Tensor:
    return torch.tril(torch.ones(size, size))  # Mistake: floats; the rule is a (size, size) torch.bool


def rank_slice(batch_size: int, rank: int, world_size: int) -> slice:
    if world_size < 1:
        raise ValueError(f"world_size must be at least 1, got {world_size}")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be in 0..{world_size - 1}, got {rank}")
    if batch_size % world_size:
        raise ValueError(f"the global batch size {batch_size} is not divisible")  # Mistake: the world size unnamed
    per_rank = batch_size // world_size
    return slice(rank * per_rank, (rank + 1) * per_rank)


def lr_at(step: int, max_lr: float, min_lr: float, warmup: int, total: int):
    if step < warmup:
        return max_lr * (step + 1) / warmup
    progress = torch.tensor(min((step - warmup) / max(1, total - warmup), 1.0))
    return min_lr + 0.5 * (1.0 + torch.cos(torch.pi * progress)) * (max_lr - min_lr)  # Mistake: a tensor, not a float
