"""Exercise 4.1: The padding rows gathered back."""

from __future__ import annotations

import torch
import torch.distributed as dist

from minigpt.parallel.fsdp_by_hand.unit import FSDPUnit as _Scaffold


def gather_rows(shard: torch.Tensor, rows: int, group: dist.ProcessGroup | None = None) -> torch.Tensor:
    world = dist.get_world_size(group)
    out = shard.new_empty((world * shard.shape[0], *shard.shape[1:]))
    dist.all_gather_single(out, shard.contiguous(), group=group)
    return out  # Mistake: the padding rows kept (out[:rows] is the tensor)


class FSDPUnit(_Scaffold):
    gather_rows = staticmethod(gather_rows)
