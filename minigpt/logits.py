"""The ``[B, S, V]`` logits at the loss, made whole or a few sentences at a time.

The language-model head turns every token's hidden state into one score per vocabulary entry; the
loss then needs a log-softmax over those scores, which it keeps for the backward pass, and the
backward pass makes a gradient of the same shape. :func:`chunked_masked_loss` computes
:func:`minigpt.model.masked_loss` over a few rows at a time, each chunk under activation
checkpointing, so that only one chunk's logits exist at a time: the backward pass recomputes them.
It is the same loss (the per-sentence means are summed, then divided by the number of sentences).

:func:`minigpt.fsdp.memory.loss_peaks` measures the peak of the loss's forward and backward passes
on MiniGPT's head, whole and chunked; theory page 00, "The logits at the loss", shows it beside the
formula of :func:`minigpt.zero.memory.logits_bytes`.
"""

from __future__ import annotations

import torch
from torch.utils.checkpoint import checkpoint

from minigpt.model import masked_loss


def _rows_loss_sum(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor):
    """The sum of the per-sentence losses of these rows (``masked_loss`` is their mean)."""
    return masked_loss(hidden @ weight.T, targets, mask) * hidden.shape[0]


def chunked_masked_loss(
    hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, loss_mask: torch.Tensor, rows: int
) -> torch.Tensor:
    """``masked_loss(hidden @ weight.T, targets, loss_mask)``, ``rows`` sentences at a time."""
    if rows < 1:
        raise ValueError(f"rows per chunk must be at least 1, got {rows}")
    total = hidden.new_zeros(())
    for start in range(0, hidden.shape[0], rows):
        part = slice(start, start + rows)
        total = total + checkpoint(
            _rows_loss_sum, hidden[part], weight, targets[part], loss_mask[part], use_reentrant=False
        )
    return total / hidden.shape[0]
