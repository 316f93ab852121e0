"""A second stated rule broken at a time (see lab00_baseline.py here).

Lab 04: a depth below 1 prefetches one unit anyway (the rule: no prefetch) (4.5).
"""

from __future__ import annotations

from minigpt.parallel.fsdp_by_hand import prefetch
from minigpt.parallel.fsdp_by_hand.unit import FSDPUnit as _Scaffold


def backward_prefetch_targets(post_forward_order: list[str], current: str, depth: int = 1) -> list[str]:
    return prefetch.backward_prefetch_targets(post_forward_order, current, max(depth, 1))  # Mistake: depth 0 -> 1


class FSDPUnit(_Scaffold):
    backward_prefetch_targets = staticmethod(backward_prefetch_targets)
