"""Exercise 4.4: .grad written over, not added to."""

from __future__ import annotations

import torch
import torch.distributed as dist

from minigpt.parallel.fsdp_by_hand.gradients import global_grad_norm
from minigpt.parallel.fsdp_by_hand.unit import FSDPUnit as _Scaffold


def reduce_gradients(unit) -> None:
    params = [p for p in unit.params if p.full.grad is not None]
    if not params:
        return
    world, columns = unit.world_size, []
    for p in params:
        padded = p.full.grad.new_zeros((world * p.shard.shape[0], *p.shape[1:]), dtype=unit.reduce_dtype)
        padded[: p.rows] = p.full.grad
        columns.append(padded.reshape(world, -1))
    buffer = torch.cat(columns, dim=1).reshape(-1)
    out = buffer.new_empty(buffer.numel() // world)
    dist.reduce_scatter_single(out, buffer, op=dist.ReduceOp.SUM, group=unit.group)
    out /= world
    offset = 0
    for p in params:
        n = p.shard.numel()
        p.shard.grad = out[offset : offset + n].view(p.shard.shape).to(p.shard.dtype)  # Mistake: not added
        offset += n
        p.full.grad = None


class FSDPUnit(_Scaffold):
    reduce_scatter_gradients = staticmethod(reduce_gradients)

    global_grad_norm = staticmethod(global_grad_norm)
