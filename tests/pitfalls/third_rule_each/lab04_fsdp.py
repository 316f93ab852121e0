"""A third stated rule broken at a time (see lab00_baseline.py here).

Lab 04: the reduced gradient written over a shard's ``.grad`` that is already there instead of added
to it, so gradient accumulation keeps only the last micro-batch (4.4); a unit that ran twice placed in
the backward order by its first finish, not its last (4.5); before_backward makes its own unit whole
but starts no all-gather ahead for the next backward (4.3).
"""

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


def backward_prefetch_targets(post_forward_order: list[str], current: str, depth: int = 1) -> list[str]:
    first_finish: dict[str, int] = {}
    for i, name in enumerate(post_forward_order):
        first_finish.setdefault(name, i)  # Mistake: a unit that ran twice counts at its first finish
    backward_order = sorted(first_finish, key=first_finish.__getitem__, reverse=True)
    if current not in backward_order or depth < 1:
        return []
    i = backward_order.index(current)
    return backward_order[i + 1 : i + 1 + depth]


class FSDPUnit(_Scaffold):
    reduce_scatter_gradients = staticmethod(reduce_gradients)
    global_grad_norm = staticmethod(global_grad_norm)
    backward_prefetch_targets = staticmethod(backward_prefetch_targets)

    def before_backward(self) -> None:
        self.unshard()
        self.wait_unshard()  # Mistake: no all-gather ahead for the units whose backward comes next
