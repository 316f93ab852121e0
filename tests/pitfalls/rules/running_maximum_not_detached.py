"""Exercise 5.4: The maximum not detached."""

from __future__ import annotations

import torch


def online_softmax_step(m, total, acc, scores, v):
    top = scores.amax(dim=-1)  # Mistake: not scores.detach(): the running maximum carries a gradient
    if m is not None:
        top = torch.maximum(m, top)
    p = torch.exp(scores - top.unsqueeze(-1))
    if m is None:
        return top, p.sum(dim=-1), p @ v
    shrink = torch.exp(m - top)
    return top, total * shrink + p.sum(dim=-1), acc * shrink.unsqueeze(-1) + p @ v
