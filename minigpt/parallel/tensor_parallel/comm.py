"""The communication of tensor parallelism: two conjugate pairs of autograd operators.

Megatron-LM's tensor parallelism needs only two operators, each the other's transpose:

* :func:`copy_to_tp` ("f"): the identity in forward (every rank of the group already holds the
  same input), an **all-reduce** in backward (each rank computed only its share of the input's
  gradient, through its own columns of the next weight);
* :func:`reduce_from_tp` ("g"): an **all-reduce** in forward (each rank holds a partial sum, the
  product of its rows of a weight), the identity in backward (the gradient of a sum reaches every
  term unchanged).

Sequence parallelism (Korthikanti et al., 2022) cuts the all-reduce in its two halves and moves
them, so that between the tensor-parallel layers each rank keeps only ``T / tp`` of the tokens:

* :func:`gather_from_sequence`: **all-gather** along the sequence in forward (a column-parallel
  layer needs every token), **reduce-scatter** in backward;
* :func:`reduce_scatter_to_sequence`: **reduce-scatter** along the sequence in forward (the partial
  sums of a row-parallel layer, each rank keeping the sum of its own tokens), **all-gather** in
  backward. :func:`scatter_to_sequence` is the same operator under its shorter name.

An all-reduce is a reduce-scatter followed by an all-gather, so the two pairs send the same bytes.
Every collective here runs on Lab 01's ring (:mod:`minigpt.parallel.ring`, point-to-point
``send``/``recv``), so the byte counter records what really went through ``send``: with ``N``
ranks and a tensor of ``S`` bytes, ``2 (N-1)/N * S`` for an all-reduce and ``(N-1)/N * S`` for an
all-gather or a reduce-scatter (exact when ``N`` divides the element count, as it does for every
activation of MiniGPT at ``tp`` = 2 and 4). Pass a :class:`~minigpt.parallel.ring.ByteCounter` to
count one model on its own; the default is this module's :data:`COUNTER`, not Lab 01's.

The ring's sum gives the same bits on every rank (the all-gather copies the finished chunks), so the
replicated regions of the model (the residual stream, the layer norms) stay bit-identical across
the group, in float32 as in float64.

Sequence layout: activations are ``(B, T, C)``; the sequence is dimension 1. A collective along the
sequence moves it to the front, ``(T, B, C)``, so that the ring's ``N`` equal flat chunks are ``N``
contiguous runs of ``T / N`` tokens: rank ``r`` holds tokens ``[r T/N, (r+1) T/N)``.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from minigpt.parallel.ring import (
    ByteCounter,
    chunk_bounds,
    exchange,
    ring_all_gather,
    ring_all_reduce,
    ring_position,
    ring_reduce_scatter,
)

# The counter of every tensor-parallel collective of this process, unless one is passed in.
COUNTER = ByteCounter()

Group = dist.ProcessGroup | None


def _counter(counter: ByteCounter | None) -> ByteCounter:
    return COUNTER if counter is None else counter


def all_reduce(x: torch.Tensor, group: Group = None, counter: ByteCounter | None = None) -> torch.Tensor:
    """The sum of ``x`` over the group, as a new tensor (the ring all-reduce of Lab 01)."""
    out = x.detach().clone().contiguous()
    if dist.get_world_size(group) > 1:
        ring_all_reduce(out, "sum", group, _counter(counter))
    return out


def all_reduce_max(x: torch.Tensor, group: Group = None, counter: ByteCounter | None = None) -> torch.Tensor:
    """The element-wise maximum of ``x`` over the group, as a new tensor: a ring reduce-scatter
    that keeps the larger value instead of adding, then the ring all-gather. Same bytes as a sum
    all-reduce (Lab 01's ring only sums, so the reducing half is written here)."""
    out = x.detach().clone().contiguous()
    ring = ring_position(group)
    n, r = ring.world_size, ring.rank
    if n == 1:
        return out
    flat, counter = out.view(-1), _counter(counter)
    bounds = chunk_bounds(flat.numel(), n)
    for step in range(n - 1):
        s0, s1 = bounds[(r - step - 1) % n]
        r0, r1 = bounds[(r - step - 2) % n]
        incoming = torch.empty(r1 - r0, dtype=flat.dtype, device=flat.device)
        exchange(ring, flat[s0:s1], incoming, counter)
        torch.maximum(flat[r0:r1], incoming, out=flat[r0:r1])
    ring_all_gather(out, group, counter)
    return out


def _check_sequence(length: int, world: int) -> None:
    if length % world:
        raise ValueError(f"sequence parallelism needs a sequence length divisible by tp: T={length}, tp={world}")


def sequence_all_gather(x: torch.Tensor, group: Group = None, counter: ByteCounter | None = None) -> torch.Tensor:
    """``(B, T/N, C)`` on every rank -> ``(B, T, C)``, rank r's tokens at ``[r T/N, (r+1) T/N)``."""
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    if world == 1:
        return x.detach().clone()
    local = x.detach().transpose(0, 1)  # (T/N, B, C)
    full = torch.empty((local.shape[0] * world, *local.shape[1:]), dtype=x.dtype, device=x.device)
    full[rank * local.shape[0] : (rank + 1) * local.shape[0]] = local
    ring_all_gather(full, group, _counter(counter))
    return full.transpose(0, 1)


def sequence_reduce_scatter(x: torch.Tensor, group: Group = None, counter: ByteCounter | None = None) -> torch.Tensor:
    """``(B, T, C)`` partial sums on every rank -> ``(B, T/N, C)``: the sum over the group of this
    rank's tokens only."""
    world = dist.get_world_size(group)
    if world == 1:
        return x.detach().clone()
    _check_sequence(x.shape[1], world)
    work = x.detach().transpose(0, 1).contiguous()  # (T, B, C): the ring's chunks are runs of tokens
    mine = ring_reduce_scatter(work, "sum", group, _counter(counter))
    return mine.view(x.shape[1] // world, x.shape[0], *x.shape[2:]).transpose(0, 1).clone()


class _CopyToTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, group: Group, counter: ByteCounter | None) -> torch.Tensor:
        ctx.group, ctx.counter = group, counter
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return all_reduce(grad, ctx.group, ctx.counter), None, None


class _ReduceFromTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, group: Group, counter: ByteCounter | None) -> torch.Tensor:
        return all_reduce(x, group, counter)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad, None, None


class _GatherFromSequence(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, group: Group, counter: ByteCounter | None) -> torch.Tensor:
        ctx.group, ctx.counter = group, counter
        return sequence_all_gather(x, group, counter)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return sequence_reduce_scatter(grad, ctx.group, ctx.counter), None, None


class _ReduceScatterToSequence(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, group: Group, counter: ByteCounter | None) -> torch.Tensor:
        ctx.group, ctx.counter = group, counter
        return sequence_reduce_scatter(x, group, counter)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return sequence_all_gather(grad, ctx.group, ctx.counter), None, None


def copy_to_tp(x: torch.Tensor, group: Group = None, counter: ByteCounter | None = None) -> torch.Tensor:
    """ "f": identity forward, all-reduce of the gradient backward. Put it before a column-parallel
    layer whose input every rank holds whole."""
    return _CopyToTP.apply(x, group, counter)


def reduce_from_tp(x: torch.Tensor, group: Group = None, counter: ByteCounter | None = None) -> torch.Tensor:
    """ "g": all-reduce forward, identity backward. Put it after a row-parallel layer, whose output
    on each rank is one term of the sum."""
    return _ReduceFromTP.apply(x, group, counter)


def gather_from_sequence(x: torch.Tensor, group: Group = None, counter: ByteCounter | None = None) -> torch.Tensor:
    """Sequence parallelism's "f": all-gather the tokens forward, reduce-scatter backward.
    ``(B, T/N, C)`` -> ``(B, T, C)``."""
    return _GatherFromSequence.apply(x, group, counter)


def reduce_scatter_to_sequence(
    x: torch.Tensor, group: Group = None, counter: ByteCounter | None = None
) -> torch.Tensor:
    """Sequence parallelism's "g": reduce-scatter along the tokens forward, all-gather backward.
    ``(B, T, C)`` partial sums -> ``(B, T/N, C)`` finished sums of this rank's tokens."""
    return _ReduceScatterToSequence.apply(x, group, counter)


scatter_to_sequence = reduce_scatter_to_sequence
