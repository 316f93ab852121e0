"""A second stated rule broken at a time (tests/test_grader.py grades this folder one exercise at a
time, as it grades tests/pitfalls/one_rule_each/: the reference stands in for every other exercise).

Lab 00: a sentence with no position to learn from divides 0 by 0 (nan) instead of counting 0 (0.2); a
rank outside 0..N-1 gets rows past the batch instead of a ValueError (0.3); the cosine ends at 0, not
at min_lr (0.4).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from minigpt.model import causal_mask  # noqa: F401


def masked_loss(logits: torch.Tensor, targets: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor:
    per_token = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="none").view_as(targets)
    mask = loss_mask.to(per_token.dtype)
    # Mistake: an empty row divides 0 by 0; the rule counts it 0 (clamp the count to at least 1)
    per_row = (per_token * mask).sum(dim=1) / mask.sum(dim=1)
    return per_row.mean()


def rank_slice(batch_size: int, rank: int, world_size: int) -> slice:
    if world_size < 1:
        raise ValueError(f"world_size must be at least 1, got {world_size}")
    if batch_size % world_size:
        raise ValueError(f"the global batch size {batch_size} is not divisible by the world size {world_size}")
    per_rank = batch_size // world_size
    return slice(rank * per_rank, (rank + 1) * per_rank)  # Mistake: a rank outside 0..N-1 is not refused


def lr_at(step: int, max_lr: float, min_lr: float, warmup: int, total: int) -> float:
    if step < warmup:
        return max_lr * (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return 0.5 * (1.0 + math.cos(math.pi * min(progress, 1.0))) * max_lr  # Mistake: down to 0, not to min_lr
