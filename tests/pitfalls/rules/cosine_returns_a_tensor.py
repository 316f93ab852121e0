"""Exercise 0.4: The cosine computed with torch: a tensor comes back, not a float."""

from __future__ import annotations

import torch


def lr_at(step: int, max_lr: float, min_lr: float, warmup: int, total: int):
    if step < warmup:
        return max_lr * (step + 1) / warmup
    progress = torch.tensor(min((step - warmup) / max(1, total - warmup), 1.0))
    return min_lr + 0.5 * (1.0 + torch.cos(torch.pi * progress)) * (max_lr - min_lr)  # Mistake: a tensor, not a float
