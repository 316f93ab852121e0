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
the ranks' gradients is the gradient of the whole batch). Each shard's ``.grad`` is its piece of
the result, in the shard's dtype (fp32 master weights get fp32 gradients after a bf16 forward). A
parameter without a gradient this step (unused, or frozen) is left out on every rank alike.

**Clipping.** ``clip_grad_norm_`` must use the norm of the *whole* gradient. Each rank computes
the norm of its piece of each parameter's gradient, one all-reduce sums their squares over the
ranks (one number per parameter), and the norm of the square roots is the global norm, the same
on every rank. The largest local norm, or the local norm alone, would clip each rank by a
different factor and the shards would no longer be pieces of one model's step.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from minigpt.parallel.fsdp_by_hand.marks import WHOLE_ATTR, find_units


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


def local_norms(model: nn.Module) -> list[torch.Tensor]:
    """The norm of this rank's piece of each parameter's gradient (padding rows left out), in the
    model's parameter order; parameters without a gradient are left out. A parameter a unit keeps
    whole (``ignored_params``) is every rank's whole: its norm counts on the group's first rank
    only (0 elsewhere), so that the sum over the ranks is its square, exactly."""
    sharded = {id(p.shard): (p, unit) for unit in find_units(model) for p in unit.params}
    norms = []
    for shard in model.parameters():
        if shard.grad is None:
            continue
        if id(shard) not in sharded:
            unit = shard.__dict__.get(WHOLE_ATTR)
            norm = torch.linalg.vector_norm(shard.grad)
            norms.append(norm if unit is None or unit.rank == 0 else torch.zeros_like(norm))
            continue
        p, unit = sharded[id(shard)]
        norms.append(torch.linalg.vector_norm(real_rows(shard.grad, p.rows, unit.rank, unit.world_size)))
    return norms


@torch.no_grad()
def global_grad_norm(model: nn.Module) -> torch.Tensor:
    """The 2-norm of the whole gradient of ``model``, the same on every rank (a collective).

    Each rank takes the norm of its piece of each parameter's gradient; one all-reduce sums their
    squares over the ranks, parameter by parameter (one number per parameter: 44 for MiniGPT); the
    square roots are the whole parameters' norms, and the norm of those is the norm of the whole
    gradient: ``clip_grad_norm_``'s arithmetic on FSDP2's sharded gradients, in the same order, so
    the two agree to the bit.
    """
    norms = local_norms(model)
    if not norms:
        return torch.zeros((), device=next(model.parameters()).device)
    squares = torch.stack(norms).pow(2)
    units = find_units(model)
    if units:
        dist.all_reduce(squares, op=dist.ReduceOp.SUM, group=units[0].group)
    return torch.linalg.vector_norm(squares.pow(0.5))


@torch.no_grad()
def clip_grad_norm_(model: nn.Module, max_norm: float) -> torch.Tensor:
    """Scale the shards' gradients so that the norm of the whole gradient is at most
    ``max_norm``, as ``torch.nn.utils.clip_grad_norm_`` does in one process; returns the global
    norm. Every rank must call it."""
    units = find_units(model)
    norm = units[0].clipping_norm(model) if units else global_grad_norm(model)
    scale = (max_norm / (norm + 1e-6)).clamp(max=1.0)
    for p in model.parameters():
        if p.grad is not None:
            p.grad.mul_(scale.to(p.grad.dtype))
    return norm
