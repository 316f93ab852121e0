"""Exercise 4.4: No full.grad taken as zeros."""

from __future__ import annotations

import torch

from minigpt.parallel.fsdp_by_hand import gradients
from minigpt.parallel.fsdp_by_hand.sharding import shard_rows  # noqa: F401  (4.1's other half, right)
from minigpt.parallel.fsdp_by_hand.unit import FSDPUnit as _Scaffold


def reduce_gradients(unit) -> None:
    for p in unit.params:
        if p.full.grad is None:  # Mistake: a parameter without gradient takes part, as zeros
            p.full.grad = torch.zeros(p.shape, dtype=p.full.dtype)
    gradients.reduce_gradients(unit)


class FSDPUnit(_Scaffold):
    reduce_scatter_gradients = staticmethod(reduce_gradients)
