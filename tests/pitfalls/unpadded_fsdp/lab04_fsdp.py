"""Lab 04, one mistake: the gradients reduce-scattered from an unpadded buffer (4.4).

The gradients are flattened and concatenated as they are, without padding each to its shard's
rows: chunk r of the buffer is then not rank r's rows. Everything else is the reference's.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from minigpt.parallel.fsdp_by_hand.gradients import global_grad_norm  # noqa: F401
from minigpt.parallel.fsdp_by_hand.ownership import unit_parameters  # noqa: F401
from minigpt.parallel.fsdp_by_hand.prefetch import backward_prefetch_targets  # noqa: F401
from minigpt.parallel.fsdp_by_hand.sharding import gather_rows, shard_rows  # noqa: F401
from minigpt.parallel.fsdp_by_hand.unit import FSDPUnit as _Scaffold


def reduce_gradients(unit) -> None:
    params = [p for p in unit.params if p.full.grad is not None]
    if not params:
        return
    world = unit.world_size
    buffer = torch.cat([p.full.grad.to(unit.reduce_dtype).reshape(-1) for p in params])  # Mistake: no padding
    buffer = torch.cat([buffer, buffer.new_zeros(-buffer.numel() % world)])  # only made divisible as a whole
    out = buffer.new_empty(buffer.numel() // world)
    dist.reduce_scatter_single(out, buffer, op=dist.ReduceOp.SUM, group=unit.group)
    out /= world
    out = torch.cat([out, out.new_zeros(sum(p.shard.numel() for p in params) - out.numel())])
    offset = 0
    for p in params:
        piece = out[offset : offset + p.shard.numel()].view(p.shard.shape).to(p.shard.dtype)
        offset += p.shard.numel()
        p.shard.grad = piece if p.shard.grad is None else p.shard.grad + piece
        p.full.grad = None


class FSDPUnit(_Scaffold):
    reduce_scatter_gradients = staticmethod(reduce_gradients)
