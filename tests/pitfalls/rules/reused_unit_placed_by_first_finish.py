"""Exercise 4.5: A unit used twice placed by its first finish."""

from __future__ import annotations

from minigpt.parallel.fsdp_by_hand.unit import FSDPUnit as _Scaffold


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
    backward_prefetch_targets = staticmethod(backward_prefetch_targets)
