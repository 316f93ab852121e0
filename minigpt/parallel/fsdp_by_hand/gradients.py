"""A unit's gradients: reduce-scattered into the shards, and clipped by their global norm.

**Reduce-scatter.** After a unit's backward, each rank holds the *full* gradient of every
parameter of the unit, computed from its own slice of the batch. Data parallelism wants their
average, but each rank only keeps the rows of its shard: a reduce-scatter sums the N ranks'
buffers and leaves rank r with chunk r of the sum. The buffer must be laid out so that chunk r
is exactly rank r's rows of every parameter, in the order the unit lists them:

    rank-major buffer = [ p1 rows of rank 0 | p2 rows of rank 0 | ... | p1 rows of rank 1 | ... ]

Each gradient is padded with zero rows to its padded shape (as its shard was), viewed as
``(N, rows/N * cols)``, the views are put side by side and flattened. The sum is divided by N
(the mean over ranks; the loss of each rank is already the mean over its rows, so the mean of
the ranks' gradients is the gradient of the whole batch). Then each shard's ``.grad`` is its
piece of the result, in the shard's dtype (fp32 master weights get fp32 gradients even when the
forward ran in bf16). A parameter that got no gradient in this step (unused, or frozen) is left
out, on every rank alike, and its shard keeps no ``.grad``, as in one process.

**Clipping.** ``clip_grad_norm_`` must use the norm of the *whole* gradient. Each rank computes
the norm of its own shards' gradients, one all-reduce sums the squares of the ranks' norms, and
its square root is the global norm on every rank. The
largest local norm, or the local norm alone, would clip each rank by a different factor and the
shards would no longer be pieces of one model's step.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn


def reduce_gradients(unit) -> None:
    """Reduce-scatter (mean over ranks) the full gradients of ``unit``'s parameters into their
    shards' ``.grad`` (added to a ``.grad`` already there), and drop the full gradients."""
    params = [p for p in unit.params if p.full.grad is not None]
    if not params:
        return
    world = unit.world_size
    dtype = unit.reduce_dtype
    columns = []
    for p in params:
        grad = p.full.grad.to(dtype)
        padded = grad.new_zeros((world * p.shard.shape[0], *p.shape[1:]))
        padded[: p.rows] = grad
        columns.append(padded.reshape(world, -1))
    buffer = torch.cat(columns, dim=1).reshape(-1)
    out = buffer.new_empty(buffer.numel() // world)
    unit.record_collective("reduce-scatter", buffer, is_async=False)
    dist.reduce_scatter_single(out, buffer, op=dist.ReduceOp.SUM, group=unit.group)
    out /= world
    offset = 0
    for p in params:
        n = p.shard.numel()
        piece = out[offset : offset + n].view(p.shard.shape).to(p.shard.dtype)
        offset += n
        if p.shard.grad is None:
            p.shard.grad = piece
        else:
            p.shard.grad += piece
        p.full.grad = None


def real_rows(shard: torch.Tensor, rows: int, rank: int, world_size: int) -> torch.Tensor:
    """The rows of ``shard`` that hold the parameter (the padding rows dropped)."""
    start = rank * shard.shape[0]
    return shard[: max(0, min(shard.shape[0], rows - start))]


@torch.no_grad()
def global_grad_norm(model: nn.Module) -> torch.Tensor:
    """The 2-norm of the whole gradient of ``model``, the same on every rank (a collective).

    Each rank takes the norm of each of its shards' gradients (padding rows left out), in the
    model's parameter order, then the norm of those norms: its part. The whole norm is the square root of the sum over ranks of the
    parts' squares: one all-reduce of one number. (``torch.nn.utils.clip_grad_norm_`` on FSDP2's
    sharded gradients takes another order: one all-reduce per parameter for its whole norm, then
    the norm of those. The two results differ in the last bit of a float32 now and then.)
    """
    from minigpt.parallel.fsdp_by_hand.api import find_units

    units = find_units(model)
    sharded = {id(p.shard): (p, unit) for unit in units for p in unit.params}
    norms = []
    for shard in model.parameters():  # the model's order, as torch's clip_grad_norm_ sums them
        if shard.grad is None:
            continue
        p, unit = sharded[id(shard)]
        norms.append(torch.linalg.vector_norm(real_rows(shard.grad, p.rows, unit.rank, unit.world_size)))
    device = next(model.parameters()).device
    part = torch.linalg.vector_norm(torch.stack(norms)) if norms else torch.zeros((), device=device)
    squares = part.pow(2)
    if units:
        units[0].record_collective("all-reduce", squares.reshape(1), is_async=False)
        dist.all_reduce(squares, op=dist.ReduceOp.SUM, group=units[0].group)
    return squares.pow(0.5)


@torch.no_grad()
def clip_grad_norm_(model: nn.Module, max_norm: float) -> torch.Tensor:
    """Scale the shards' gradients so that the norm of the whole gradient is at most
    ``max_norm``, as ``torch.nn.utils.clip_grad_norm_`` does in one process; returns the global
    norm. Every rank must call it."""
    from minigpt.parallel.fsdp_by_hand.api import find_units

    units = find_units(model)
    norm = units[0].global_grad_norm(model) if units else global_grad_norm(model)
    scale = (max_norm / (norm + 1e-6)).clamp(max=1.0)
    for p in model.parameters():
        if p.grad is not None:
            p.grad.mul_(scale.to(p.grad.dtype))
    return norm
