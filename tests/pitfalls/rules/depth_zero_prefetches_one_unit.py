"""Exercise 4.5: Depth 0 prefetches one unit."""

from __future__ import annotations

from minigpt.parallel.fsdp_by_hand import prefetch
from minigpt.parallel.fsdp_by_hand.sharding import shard_rows  # noqa: F401  (4.1's other half, right)
from minigpt.parallel.fsdp_by_hand.unit import FSDPUnit as _Scaffold


def backward_prefetch_targets(post_forward_order: list[str], current: str, depth: int = 1) -> list[str]:
    return prefetch.backward_prefetch_targets(post_forward_order, current, max(depth, 1))  # Mistake: depth 0 -> 1


class FSDPUnit(_Scaffold):
    backward_prefetch_targets = staticmethod(backward_prefetch_targets)
