"""Lab 00 exercises: MiniGPT and the single-process baseline.

Fill in each function, then grade yourself:

    make grade LAB=00          # this lab: points per exercise, one line per lost point
    make grade EX=0.1          # one exercise (the reference stands in for the others)
    make grade LAB=00 LANG=es  # el informe en español
    make hint EX=0.2           # stuck? the next hint of one exercise (one more on each call)

Each stub has the signature of the reference in ``minigpt/`` and states its task: what the function
must achieve, its contract (inputs, outputs, shapes, what must hold) and why it matters. The steps
are in the hints. Read the lab guide first: ``lab/00-minigpt-baseline.md``.
"""

from __future__ import annotations

import torch


def causal_mask(size: int) -> torch.Tensor:
    """Exercise 0.1: the causal attention mask.

    Return a ``(size, size)`` tensor of dtype ``torch.bool`` that is True where query position
    ``i`` may attend to key position ``j``, that is where ``j <= i``. The model uses it as
    ``scores.masked_fill(~mask, -inf)`` so that no position can see the future.
    """
    raise NotImplementedError("Exercise 0.1: build the (size, size) bool causal mask, True where j <= i")


def masked_loss(logits: torch.Tensor, targets: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor:
    """Exercise 0.2: the loss counted only on the correction.

    ``logits`` has shape (B, T, V), ``targets`` (B, T) token ids, ``loss_mask`` (B, T) bool.
    Compute the cross-entropy of every position, keep only the positions where ``loss_mask`` is
    True, average them **per row** (per sentence), then average the rows. A row with no masked
    position counts as 0. Return a scalar tensor that gradients can flow through.

    Why per row: then the loss of a batch is exactly the mean of the losses of its equal
    slices, which is what N data-parallel ranks compute together.
    """
    raise NotImplementedError(
        "Exercise 0.2: per-sentence mean of the cross-entropy where loss_mask is True, then the mean over sentences"
    )


def rank_slice(batch_size: int, rank: int, world_size: int) -> slice:
    """Exercise 0.3: which rows of the global batch a data-parallel rank trains on.

    Rank ``r`` of ``N`` gets rows ``r*B/N`` to ``(r+1)*B/N - 1`` (a ``slice``). Raise
    ``ValueError`` with a message that names the values when ``world_size < 1``, when ``rank``
    is not in ``0..world_size-1``, or when ``batch_size`` is not divisible by ``world_size``.

    Why: together the N slices are exactly the batch one process trains on, each row once, which
    is what makes a distributed run comparable with one process. Silently dropping or repeating the
    rows that do not divide would train on another batch.
    """
    raise NotImplementedError(
        "Exercise 0.3: return slice(r*B/N, (r+1)*B/N) and reject a batch the world size does not divide"
    )


def lr_at(step: int, max_lr: float, min_lr: float, warmup: int, total: int) -> float:
    """Exercise 0.4: the learning-rate schedule (linear warm-up, then cosine decay).

    For ``step < warmup``: ``max_lr * (step + 1) / warmup``. After that, a half cosine from
    ``max_lr`` (at ``step == warmup``) down to ``min_lr`` (at ``step == total``), and ``min_lr``
    for any later step. Return a Python float.

    Why: Adam's second-moment estimate is poor in the first steps, and full-size steps taken on it
    can throw the weights where training does not recover; the decay lets the last steps settle.
    Every rank computes the same rate from the same step, so no rank needs to send it.
    """
    raise NotImplementedError(
        "Exercise 0.4: linear warm-up to max_lr over `warmup` steps, then cosine decay to min_lr at `total`"
    )
