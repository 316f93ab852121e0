"""One parameter, cut into equal shards and gathered back: the storage rule of ZeRO-3.

Every parameter is cut along its first dimension (its rows) into N equal chunks, one per rank.
When N does not divide the rows, the tensor is first padded with zero rows to the next multiple
of N (FSDP2 does the same: MiniGPT's 609-row embedding becomes 610 rows on 2 ranks, 612 on 4),
so that every rank's shard has the same shape and one all-gather of equal pieces rebuilds it.

    rows 609, N = 2:  padded to 610, rank 0 keeps rows 0..304, rank 1 rows 305..609
                      (rank 1's last row is padding: zeros that are sent but never used)

A rank's shard is an ordinary tensor of shape ``(padded_rows / N, *rest)``; the unit
(:mod:`.unit`) makes it the module's ``nn.Parameter``, so the optimizer only ever sees shards.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist


def padded_rows(rows: int, world_size: int) -> int:
    """``rows`` rounded up to a multiple of ``world_size``."""
    return world_size * math.ceil(rows / world_size)


def shard_rows(full: torch.Tensor, rank: int, world_size: int) -> torch.Tensor:
    """Rank ``rank``'s chunk of ``full`` along dimension 0, padded with zero rows: a new tensor
    (not a view) of shape ``(padded_rows(rows, N) / N, *full.shape[1:])``."""
    rows = full.shape[0]
    per_rank = padded_rows(rows, world_size) // world_size
    out = full.new_zeros((per_rank, *full.shape[1:]))
    start, stop = rank * per_rank, min((rank + 1) * per_rank, rows)
    if stop > start:
        out[: stop - start] = full[start:stop]
    return out


def gather_rows(shard: torch.Tensor, rows: int, group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """The full tensor of ``rows`` rows rebuilt from every rank's ``shard`` (one all-gather;
    every rank must call it), the padding rows dropped."""
    world_size = dist.get_world_size(group)
    full = shard.new_empty((world_size * shard.shape[0], *shard.shape[1:]))
    dist.all_gather_single(full, shard.contiguous(), group=group)
    return full[:rows]
