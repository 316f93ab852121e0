"""One stated rule broken at a time (tests/test_grader.py grades this folder one exercise at a time,
the reference standing in for every other exercise, so each mistake below costs only its own tests).

Lab 00: the warm-up counted from step 1, ``max_lr * step / warmup``: step 0 trains at 0 and the
warm-up reaches max_lr one step late (0.4); the loss returned as a Python float (``.item()``), so no
gradient flows back through it (0.2); the batch divided before the world size is checked, so a world
of 0 raises ZeroDivisionError instead of a ValueError that names it (0.3).
"""

from __future__ import annotations

import math

import torch.nn.functional as F

from minigpt.model import causal_mask  # noqa: F401


def lr_at(step: int, max_lr: float, min_lr: float, warmup: int, total: int) -> float:
    if step < warmup:
        return max_lr * step / warmup  # Mistake: (step + 1) / warmup is the rule
    progress = (step - warmup) / max(1, total - warmup)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * min(progress, 1.0))) * (max_lr - min_lr)


def masked_loss(logits, targets, loss_mask):
    per_token = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="none").view_as(targets)
    mask = loss_mask.to(per_token.dtype)
    per_row = (per_token * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1)
    return per_row.mean().item()  # Mistake: a Python float; the rule is a scalar tensor gradients flow through


def rank_slice(batch_size: int, rank: int, world_size: int) -> slice:
    if batch_size % world_size:  # Mistake: a world of 0 divides by zero here; check world_size >= 1 first
        raise ValueError(f"the global batch size {batch_size} is not divisible by the world size {world_size}")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be in 0..{world_size - 1}, got {rank}")
    per_rank = batch_size // world_size
    return slice(rank * per_rank, (rank + 1) * per_rank)
