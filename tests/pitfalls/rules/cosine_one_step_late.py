"""Exercise 0.4: The cosine one step late."""

from __future__ import annotations

import math


def lr_at(step: int, max_lr: float, min_lr: float, warmup: int, total: int) -> float:
    if step < warmup:
        return max_lr * (step + 1) / warmup
    progress = (step - warmup + 1) / max(1, total - warmup)  # Mistake: the decay's step 0 is step == warmup
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * min(progress, 1.0))) * (max_lr - min_lr)
