"""Tensor-parallel layers: a weight cut across the ``tp`` ranks of a group, each rank its slice.

* :class:`ColumnParallelLinear` keeps a slice of the **output** features (rows of PyTorch's
  ``(out, in)`` weight). Its input must be whole on every rank: :func:`~.comm.copy_to_tp` before
  it (or, with sequence parallelism, :func:`~.comm.gather_from_sequence`); its output is this
  rank's slice of the features, and needs no communication.
* :class:`RowParallelLinear` keeps a slice of the **input** features (columns of the weight). Its
  input is the sliced output of a column-parallel layer; its output is one term of a sum, reduced
  by :func:`~.comm.reduce_from_tp` (or :func:`~.comm.reduce_scatter_to_sequence`). Its bias is
  whole on every rank and added **once, after the reduction**: added before it, every rank's copy
  would be summed and the bias counted ``tp`` times.
* :class:`VocabParallelEmbedding` keeps a slice of the vocabulary's rows; a token outside this
  rank's rows looks up zeros, and the all-reduce fills in the row from the rank that has it.
* :func:`vocab_parallel_cross_entropy` computes the loss from the logits of this rank's vocabulary
  slice, without ever gathering the ``V`` logits: it all-reduces the maximum, then the sum of
  exponentials and the target's logit, ``B * T`` numbers each instead of ``B * T * V``.

**Vocabulary padding.** MiniGPT's vocabulary has 609 words, which neither 2 nor 4 divides. The
embedding is padded to :func:`padded_vocab_size` rows, the next multiple of ``tp`` (610 at tp=2,
612 at tp=4), every rank holding ``padded / tp`` rows. The padding rows start at zero, no token id
reaches them, and the loss masks their logits to ``-inf``, so their probability and gradient are
exactly zero: they stay zero and change nothing. :func:`gather_logits` and the full state dict cut
them off again.

The tied output layer (``lm_head.weight = wte.weight`` in MiniGPT) becomes :meth:`VocabParallelEmbedding.logits`:
the same shard, used as a column-parallel layer whose output slice is this rank's vocabulary slice.
Both uses add into the one shard's gradient on this rank, as the tied matrix does in one process.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from types import SimpleNamespace

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn import functional as F

from minigpt.parallel.ring import ByteCounter
from minigpt.parallel.tensor_parallel import comm
from minigpt.parallel.tensor_parallel.comm import Group


def padded_vocab_size(vocab_size: int, tp: int) -> int:
    """The vocabulary rounded up to a multiple of ``tp`` (609 -> 610 at tp=2, 612 at tp=4)."""
    if tp < 1:
        raise ValueError(f"tensor-parallel degree must be at least 1, got tp={tp}")
    return -(-vocab_size // tp) * tp


def shard_rows(weight: torch.Tensor, tp: int, rank: int, parts: int = 1, what: str = "rows") -> torch.Tensor:
    """Rank ``rank``'s slice of ``weight``'s first dimension, taken from each of ``parts`` equal
    parts: ``parts=3`` slices each of q, k and v of a fused ``[q|k|v]`` projection by itself, so that
    a rank keeps the same heads of all three. Raises ValueError when ``tp`` does not divide a part."""
    part = weight.shape[0] // parts
    if weight.shape[0] % parts or part % tp:
        raise ValueError(f"tp={tp} does not divide the {part} {what} of each of {parts} part(s)")
    size = part // tp
    pieces = [weight[p * part + rank * size : p * part + (rank + 1) * size] for p in range(parts)]
    return torch.cat(pieces).detach().clone()


def column_slice(
    weight: torch.Tensor, bias: torch.Tensor | None, tp: int, rank: int, parts: int = 1
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Rank ``rank``'s share of a ``Linear`` cut by **output features** (column-parallel): its rows
    of the ``(out, in)`` weight and the same entries of the bias, from each of ``parts`` equal parts
    (``parts=3`` for a fused ``[q | k | v]``). New tensors, not views."""
    w = shard_rows(weight, tp, rank, parts, "output features")
    b = None if bias is None else shard_rows(bias, tp, rank, parts, "output features")
    return w, b


def row_slice(
    weight: torch.Tensor, bias: torch.Tensor | None, tp: int, rank: int
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Rank ``rank``'s share of a ``Linear`` cut by **input features** (row-parallel): its columns
    of the ``(out, in)`` weight, ``(out, in / tp)``; the bias whole (added once, after the sum)."""
    w = shard_rows(weight.t(), tp, rank, 1, "input features").t().contiguous()
    return w, None if bias is None else bias.detach().clone()


def row_parallel_linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, reduce: Callable[[torch.Tensor], torch.Tensor]
) -> torch.Tensor:
    """A row-parallel layer's output: ``reduce`` (the sum over the group) of this rank's partial
    product ``x W_r^T``, then the bias, **once**: added before ``reduce``, it would be summed ``tp``
    times."""
    y = reduce(F.linear(x, weight))
    return y if bias is None else y + bias


class ColumnParallelLinear(nn.Module):
    """``y_r = x W_r^T (+ b_r)``: this rank's slice of the output features.

    ``weight`` is ``(out / tp, in)``, ``bias`` ``(out / tp,)`` or None. With ``sequence_parallel``
    the input is this rank's ``T / tp`` tokens and is all-gathered first; otherwise it is whole and
    passes through ``copy_to_tp`` (whose backward all-reduces the input's gradient)."""

    def __init__(
        self,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        group: Group = None,
        counter: ByteCounter | None = None,
        sequence_parallel: bool = False,
        kit=None,
    ):
        super().__init__()
        self.weight = nn.Parameter(weight)
        self.bias = None if bias is None else nn.Parameter(bias)
        self.group, self.counter, self.sequence_parallel = group, counter, sequence_parallel
        self.kit = own_pieces() if kit is None else kit

    @classmethod
    def from_linear(
        cls, linear: nn.Linear, group: Group = None, parts: int = 1, kit=None, **kwargs
    ) -> ColumnParallelLinear:
        """Slice a whole ``nn.Linear`` by output features (``parts`` equal parts sliced each)."""
        tp, rank = dist.get_world_size(group), dist.get_rank(group)
        weight, bias = (kit or own_pieces()).column_slice(linear.weight, linear.bias, tp, rank, parts)
        return cls(weight, bias, group, kit=kit, **kwargs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.sequence_parallel:
            x = comm.gather_from_sequence(x, self.group, self.counter)
        else:
            x = self.kit.copy_to_tp(x, self.group, self.counter)
        return F.linear(x, self.weight, self.bias)


class RowParallelLinear(nn.Module):
    """``y = sum_r x_r W_r^T + b``: this rank holds the columns ``W_r`` for its input slice.

    ``weight`` is ``(out, in / tp)``; ``bias`` ``(out,)`` is whole on every rank and added after the
    reduction (all-reduce, or reduce-scatter along the sequence with ``sequence_parallel``, which
    leaves this rank ``T / tp`` tokens)."""

    def __init__(
        self,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        group: Group = None,
        counter: ByteCounter | None = None,
        sequence_parallel: bool = False,
        kit=None,
    ):
        super().__init__()
        self.weight = nn.Parameter(weight)
        self.bias = None if bias is None else nn.Parameter(bias)
        self.group, self.counter, self.sequence_parallel = group, counter, sequence_parallel
        self.kit = own_pieces() if kit is None else kit

    @classmethod
    def from_linear(cls, linear: nn.Linear, group: Group = None, kit=None, **kwargs) -> RowParallelLinear:
        """Slice a whole ``nn.Linear`` by input features; the bias is copied whole."""
        tp, rank = dist.get_world_size(group), dist.get_rank(group)
        weight, bias = (kit or own_pieces()).row_slice(linear.weight, linear.bias, tp, rank)
        return cls(weight, bias, group, kit=kit, **kwargs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.sequence_parallel:
            reduce = partial(comm.reduce_scatter_to_sequence, group=self.group, counter=self.counter)
        else:
            reduce = partial(self.kit.reduce_from_tp, group=self.group, counter=self.counter)
        return self.kit.row_parallel_linear(x, self.weight, self.bias, reduce)


class VocabParallelEmbedding(nn.Module):
    """Rows ``[start, start + padded / tp)`` of the (padded) token embedding, and the tied output layer.

    ``vocab_size`` is the true vocabulary (609); ``padded`` (default :func:`padded_vocab_size`) must
    be a multiple of ``tp``: if it is not, ValueError names both."""

    def __init__(
        self,
        full_weight: torch.Tensor,
        group: Group = None,
        counter: ByteCounter | None = None,
        sequence_parallel: bool = False,
        padded: int | None = None,
        kit=None,
    ):
        super().__init__()
        tp, rank = dist.get_world_size(group), dist.get_rank(group)
        self.vocab_size = full_weight.shape[0]
        self.padded = padded_vocab_size(self.vocab_size, tp) if padded is None else padded
        if self.padded % tp or self.padded < self.vocab_size:
            raise ValueError(
                f"a vocabulary of {self.padded} rows (true size {self.vocab_size}) cannot be cut over tp={tp}: "
                f"pad it to a multiple of tp, e.g. {padded_vocab_size(self.vocab_size, tp)}"
            )
        self.per_rank = self.padded // tp
        self.start = rank * self.per_rank
        shard = torch.zeros(self.per_rank, full_weight.shape[1], dtype=full_weight.dtype, device=full_weight.device)
        stop = min(self.start + self.per_rank, self.vocab_size)
        if stop > self.start:
            shard[: stop - self.start] = full_weight.detach()[self.start : stop]
        self.weight = nn.Parameter(shard)
        self.group, self.counter, self.sequence_parallel = group, counter, sequence_parallel
        self.kit = own_pieces() if kit is None else kit

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        """Token ids ``(B, T)`` -> embeddings ``(B, T, C)`` (``(B, T/tp, C)`` with sequence parallelism)."""
        local = idx - self.start
        outside = (local < 0) | (local >= self.per_rank)
        looked_up = F.embedding(local.masked_fill(outside, 0), self.weight)
        looked_up = looked_up.masked_fill(outside.unsqueeze(-1), 0.0)  # rows another rank holds
        if self.sequence_parallel:
            return comm.reduce_scatter_to_sequence(looked_up, self.group, self.counter)
        return self.kit.reduce_from_tp(looked_up, self.group, self.counter)

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """The tied output layer: ``(B, T, C)`` (or ``(B, T/tp, C)``) -> this rank's logits ``(B, T, padded/tp)``."""
        if self.sequence_parallel:
            x = comm.gather_from_sequence(x, self.group, self.counter)
        else:
            x = self.kit.copy_to_tp(x, self.group, self.counter)
        return F.linear(x, self.weight)


class _VocabParallelCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, targets, start, vocab_size, group, counter):
        local = logits.detach().clone()
        columns = torch.arange(start, start + local.shape[-1], device=local.device)
        local[..., columns >= vocab_size] = float("-inf")  # the padding rows are no words
        # 1. the maximum over the whole vocabulary: all-reduce of B*T numbers
        top = comm.all_reduce_max(local.amax(dim=-1), group, counter)
        exp = torch.exp(local - top.unsqueeze(-1))
        # 2. the sum of exponentials and the target's logit, in one all-reduce of 2*B*T numbers
        inside = (targets >= start) & (targets < start + local.shape[-1])
        picked = local.gather(-1, (targets - start).clamp(0, local.shape[-1] - 1).unsqueeze(-1)).squeeze(-1)
        picked = torch.where(inside, picked - top, torch.zeros_like(picked))
        sums = comm.all_reduce(torch.stack([exp.sum(dim=-1), picked]), group, counter)
        loss = torch.log(sums[0]) - sums[1]  # log sum exp(z - max) - (z_target - max)
        ctx.save_for_backward(exp / sums[0].unsqueeze(-1), targets - start, inside)
        return loss

    @staticmethod
    def backward(ctx, grad):
        probs, local_targets, inside = ctx.saved_tensors
        g = probs.clone()  # d loss / d z = softmax(z) - onehot(target), on this rank's columns only
        rows = inside.nonzero(as_tuple=True)
        g[(*rows, local_targets[rows])] -= 1.0
        return g * grad.unsqueeze(-1), None, None, None, None, None


def vocab_parallel_cross_entropy(
    logits: torch.Tensor,
    targets: torch.Tensor,
    start: int,
    vocab_size: int,
    group: Group = None,
    counter: ByteCounter | None = None,
) -> torch.Tensor:
    """Per-token cross-entropy ``(B, T)`` from this rank's logits ``(B, T, V_r)`` of the vocabulary
    columns ``[start, start + V_r)``; columns at or past ``vocab_size`` are padding and ignored.

    Communication: an all-reduce (max) of ``B*T`` numbers and one (sum) of ``2*B*T``; the backward
    needs none (``softmax - onehot`` on this rank's columns). Every rank returns the same loss."""
    return _VocabParallelCrossEntropy.apply(logits, targets, start, vocab_size, group, counter)


def masked_mean_per_sentence(per_token: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor:
    """:func:`minigpt.model.masked_loss`'s reduction, from per-token losses ``(B, T)``: each row's
    mean over its masked tokens (a row with none counts 0), then the mean over rows."""
    mask = loss_mask.to(per_token.dtype)
    per_row = (per_token * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1)
    return per_row.mean()


def gather_logits(local: torch.Tensor, vocab_size: int, group: Group = None) -> torch.Tensor:
    """Every rank's logit slice ``(B, T, V_r)`` side by side, padding cut: ``(B, T, vocab_size)``.
    For checks and generation only: it uses ``dist.all_gather`` and counts nothing."""
    pieces = [torch.empty_like(local) for _ in range(dist.get_world_size(group))]
    dist.all_gather(pieces, local.detach().contiguous(), group=group)
    return torch.cat(pieces, dim=-1)[..., :vocab_size]


def own_pieces() -> SimpleNamespace:
    """This module's own pieces (and :mod:`.comm`'s f and g), what a layer uses when it is given no
    :class:`~.kit.Kit`: the reference. A kit (the learner's pieces) has the same names."""
    return SimpleNamespace(
        column_slice=column_slice,
        row_slice=row_slice,
        row_parallel_linear=row_parallel_linear,
        copy_to_tp=comm.copy_to_tp,
        reduce_from_tp=comm.reduce_from_tp,
        vocab_parallel_cross_entropy=vocab_parallel_cross_entropy,
    )
