"""Exercise 0.4: The warm-up counted from step 1."""

from __future__ import annotations

import math


def lr_at(step: int, max_lr: float, min_lr: float, warmup: int, total: int) -> float:
    if step < warmup:
        return max_lr * step / warmup  # Mistake: (step + 1) / warmup is the rule
    progress = (step - warmup) / max(1, total - warmup)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * min(progress, 1.0))) * (max_lr - min_lr)
