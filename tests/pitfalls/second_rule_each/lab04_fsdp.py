"""A second stated rule broken at a time (see lab00_baseline.py here).

Lab 04: the whole tensor gathered with ``dist.all_gather`` into a list of ``world_size`` tensors,
then concatenated: the right tensor, but a collective per list and a copy more where the contract
asks for one all-gather into one tensor (4.1); before_forward gathers the units of its forward
prefetch synchronously, so each prefetch is waited for on the spot instead of travelling while the
unit computes (4.3); a parameter with no full gradient (unused this step, or frozen) taken as zeros instead of taking no part, so a
frozen unit sends a buffer of zeros and every buffer carries rows nobody needs (4.4); a depth below
1 prefetches one unit anyway (the rule: no prefetch) (4.5).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from minigpt.parallel.fsdp_by_hand import gradients, prefetch
from minigpt.parallel.fsdp_by_hand.sharding import shard_rows  # noqa: F401  (4.1's other half, right)
from minigpt.parallel.fsdp_by_hand.unit import FSDPUnit as _Scaffold


def gather_rows(shard: torch.Tensor, rows: int, group=None) -> torch.Tensor:
    pieces = [torch.empty_like(shard) for _ in range(dist.get_world_size(group))]
    dist.all_gather(pieces, shard.contiguous(), group=group)  # Mistake: a list of tensors, then a copy into one
    return torch.cat(pieces)[:rows]


def reduce_gradients(unit) -> None:
    for p in unit.params:
        if p.full.grad is None:  # Mistake: a parameter without gradient takes part, as zeros
            p.full.grad = torch.zeros(p.shape, dtype=p.full.dtype)
    gradients.reduce_gradients(unit)


def backward_prefetch_targets(post_forward_order: list[str], current: str, depth: int = 1) -> list[str]:
    return prefetch.backward_prefetch_targets(post_forward_order, current, max(depth, 1))  # Mistake: depth 0 -> 1


class FSDPUnit(_Scaffold):
    gather_rows = staticmethod(gather_rows)
    reduce_scatter_gradients = staticmethod(reduce_gradients)
    backward_prefetch_targets = staticmethod(backward_prefetch_targets)

    def before_forward(self) -> None:
        self.unshard()
        self.wait_unshard()
        for ahead in self.forward_prefetch:
            ahead.unshard()  # Mistake: synchronous: the prefetch is waited for here, not in flight
