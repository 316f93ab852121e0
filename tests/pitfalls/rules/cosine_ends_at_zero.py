"""Exercise 0.4: The cosine ends at 0, not at min_lr."""

from __future__ import annotations

import math


def lr_at(step: int, max_lr: float, min_lr: float, warmup: int, total: int) -> float:
    if step < warmup:
        return max_lr * (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return 0.5 * (1.0 + math.cos(math.pi * min(progress, 1.0))) * max_lr  # Mistake: down to 0, not to min_lr
