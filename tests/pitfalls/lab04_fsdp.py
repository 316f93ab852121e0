"""Lab 04 pitfalls: five classic mistakes, each to be caught by exactly its own tests.

* a tied weight owned twice (no de-duplication: the tie is cut, each copy gathered on its own) - 4.2;
* a unit freed after forward and never made whole again for backward (before_backward only prefetches) - 4.3;
* the reduce-scatter's sum kept as the gradient (not divided by the world size) - 4.4;
* the local gradient norm taken for the global one (no all-reduce) - 4.4;
* the prefetch of the unit whose backward just ran (the previous unit of the backward order) - 4.5.

Everything else is the reference's.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from minigpt.parallel.fsdp_by_hand import gradients, ownership, prefetch, sharding
from minigpt.parallel.fsdp_by_hand.gradients import real_rows
from minigpt.parallel.fsdp_by_hand.ownership import Slot
from minigpt.parallel.fsdp_by_hand.unit import FSDPUnit as _Scaffold


def shard_rows(full: torch.Tensor, rank: int, world_size: int) -> torch.Tensor:
    return sharding.shard_rows(full, rank, world_size)


def gather_rows(shard: torch.Tensor, rows: int, group: dist.ProcessGroup | None = None) -> torch.Tensor:
    return sharding.gather_rows(shard, rows, group)


def unit_parameters(unit: nn.Module, nested: list[nn.Module]) -> list[tuple[nn.Parameter, list[Slot]]]:
    # Mistake: one entry per (module, attribute) met, without asking whether the parameter was met
    # before: the tied wte/lm_head matrix becomes two entries, two shards, two gradients.
    inside = {id(m) for n in nested for m in n.modules()}
    found = []
    for prefix, module in unit.named_modules():
        if id(module) in inside:
            continue
        for attr, p in module._parameters.items():
            if p is not None:
                found.append((p, [(module, attr, f"{prefix}.{attr}" if prefix else attr)]))
    return found


def reduce_gradients(unit) -> None:
    # Mistake: the reduce-scatter sums the ranks' gradients, and the sum is kept (no division by
    # the world size): every gradient is N times too large.
    params = [p for p in unit.params if p.full.grad is not None]
    if not params:
        return
    world = unit.world_size
    columns = []
    for p in params:
        padded = p.full.grad.new_zeros((world * p.shard.shape[0], *p.shape[1:]))
        padded[: p.rows] = p.full.grad
        columns.append(padded.to(unit.reduce_dtype).reshape(world, -1))
    buffer = torch.cat(columns, dim=1).reshape(-1)
    out = buffer.new_empty(buffer.numel() // world)
    dist.reduce_scatter_single(out, buffer, op=dist.ReduceOp.SUM, group=unit.group)
    offset = 0
    for p in params:
        piece = out[offset : offset + p.shard.numel()].view(p.shard.shape).to(p.shard.dtype)
        offset += p.shard.numel()
        p.shard.grad = piece if p.shard.grad is None else p.shard.grad + piece
        p.full.grad = None


@torch.no_grad()
def global_grad_norm(model: nn.Module) -> torch.Tensor:
    # Mistake: the norm of this rank's shards only; every rank clips by its own, smaller norm.
    from minigpt.parallel.fsdp_by_hand.api import find_units

    units = find_units(model)
    sharded = {id(p.shard): (p, u) for u in units for p in u.params}
    norms = [
        torch.linalg.vector_norm(
            real_rows(s.grad, sharded[id(s)][0].rows, sharded[id(s)][1].rank, sharded[id(s)][1].world_size)
        )
        for s in model.parameters()
        if s.grad is not None
    ]
    return torch.linalg.vector_norm(torch.stack(norms)) if norms else torch.zeros(())


def backward_prefetch_targets(post_forward_order: list[str], current: str, depth: int = 1) -> list[str]:
    # Mistake: "after the current unit's backward" read as a place in the list: the unit before
    # ``current`` in the backward order, whose backward has just finished.
    last = {name: i for i, name in enumerate(post_forward_order)}
    order = sorted(last, key=last.__getitem__, reverse=True)
    if current not in order or depth < 1:
        return []
    i = order.index(current)
    return order[max(0, i - depth) : i][::-1]


class FSDPUnit(_Scaffold):
    shard_rows = staticmethod(shard_rows)
    gather_rows = staticmethod(gather_rows)
    unit_parameters = staticmethod(unit_parameters)
    reduce_scatter_gradients = staticmethod(reduce_gradients)
    global_grad_norm = staticmethod(global_grad_norm)
    backward_prefetch_targets = staticmethod(backward_prefetch_targets)

    def before_backward(self) -> None:
        # Mistake: the unit was freed after its forward and is not gathered again: backward runs on
        # parameters whose storage is 0 bytes (only the prefetch of the next units is issued).
        for ahead in self.backward_prefetch_units():
            ahead.unshard(async_op=True)


_unused = (gradients, ownership, prefetch)  # the reference modules, for a reader comparing
