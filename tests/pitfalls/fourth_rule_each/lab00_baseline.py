"""A fourth stated rule broken at a time (tests/test_grader.py grades this folder as it grades
tests/pitfalls/one_rule_each/: each test with only its own exercise the pitfall's).

Lab 00: the mask shaped (1, 1, size, size), ready to broadcast over batch and heads, instead of
(size, size) (0.1); the loss averaged over every position of a row, the ones the mask leaves out included (0.2);
the rows dealt round-robin (rank r gets rows r, r + N, ...) instead of one contiguous run each (0.3);
the cosine started one step late, so the first decay step is already below max_lr (0.4).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def masked_loss(logits: torch.Tensor, targets: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor:
    per_token = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="none").view_as(targets)
    return per_token.mean(dim=1).mean()  # Mistake: loss_mask ignored; every position counts


def rank_slice(batch_size: int, rank: int, world_size: int) -> slice:
    if world_size < 1:
        raise ValueError(f"world_size must be at least 1, got {world_size}")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be in 0..{world_size - 1}, got {rank}")
    if batch_size % world_size:
        raise ValueError(f"the global batch size {batch_size} is not divisible by the world size {world_size}")
    return slice(rank, batch_size, world_size)  # Mistake: every N-th row, not rows r*B/N .. (r+1)*B/N - 1


def lr_at(step: int, max_lr: float, min_lr: float, warmup: int, total: int) -> float:
    if step < warmup:
        return max_lr * (step + 1) / warmup
    progress = (step - warmup + 1) / max(1, total - warmup)  # Mistake: the decay's step 0 is step == warmup
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * min(progress, 1.0))) * (max_lr - min_lr)


def causal_mask(size: int) -> torch.Tensor:
    return torch.tril(torch.ones(size, size, dtype=torch.bool)).view(1, 1, size, size)  # Mistake: the shape
