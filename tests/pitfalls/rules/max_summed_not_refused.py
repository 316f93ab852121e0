"""Exercise 1.1: "max" summed instead of refused."""

from __future__ import annotations

import torch

from minigpt.parallel import ring


def ring_all_reduce(tensor: torch.Tensor, op: str = "sum", group=None, counter=None) -> torch.Tensor:
    ring.ring_reduce_scatter(tensor, "avg" if op == "avg" else "sum", group, counter)  # Mistake: "max" summed
    return ring.ring_all_gather(tensor, group, counter)
