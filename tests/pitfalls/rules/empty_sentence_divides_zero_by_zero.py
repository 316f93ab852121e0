"""Exercise 0.2: A sentence with nothing to learn from divides 0 by 0: every 0.2 test has one, and gets nan."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def masked_loss(logits: torch.Tensor, targets: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor:
    per_token = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="none").view_as(targets)
    mask = loss_mask.to(per_token.dtype)
    # Mistake: an empty row divides 0 by 0; the rule counts it 0 (clamp the count to at least 1)
    per_row = (per_token * mask).sum(dim=1) / mask.sum(dim=1)
    return per_row.mean()
