"""Exercise 0.2."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def masked_loss(logits: torch.Tensor, targets: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor:
    per_token = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="none").view_as(targets)
    return per_token.mean(dim=1).mean()  # Mistake: loss_mask ignored; every position counts
