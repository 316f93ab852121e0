"""Plausible wrong answers to the Lab 00 exercises, one classic mistake each.

tests/test_grader.py grades this folder (MINIGPT_EXERCISES_DIR) and checks that every mistake
loses exactly the points of the tests written to catch it.
"""

from __future__ import annotations

import math

import torch
from torch.nn import functional as F


def causal_mask(size: int) -> torch.Tensor:
    # Mistake: the transpose. Upper triangular lets every query see the future.
    return torch.ones(size, size, dtype=torch.bool).triu()


def masked_loss(logits: torch.Tensor, targets: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor:
    # Mistake: one mean over every counted token of the batch, not per sentence. Right for one
    # process, wrong as soon as ranks average slices holding different numbers of tokens.
    per_token = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="none")
    mask = loss_mask.flatten().to(per_token.dtype)
    return (per_token * mask).sum() / mask.sum()


def rank_slice(batch_size: int, rank: int, world_size: int) -> slice:
    # Mistake: floor division silently drops the rows that do not divide evenly.
    per_rank = batch_size // world_size
    return slice(rank * per_rank, (rank + 1) * per_rank)


def lr_at(step: int, max_lr: float, min_lr: float, warmup: int, total: int) -> float:
    # Correct: full marks here.
    if step < warmup:
        return max_lr * (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return min_lr + 0.5 * (1 + math.cos(math.pi * progress)) * (max_lr - min_lr)
