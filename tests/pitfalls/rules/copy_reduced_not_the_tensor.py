"""Exercise 1.1: A copy reduced: every test that reads the tensor it gave still sees that rank's own values."""

from __future__ import annotations

import torch

from minigpt.parallel import ring


def ring_all_reduce(tensor: torch.Tensor, op: str = "sum", group=None, counter=None) -> torch.Tensor:
    work = tensor.clone()  # Mistake: a copy is reduced; the caller's tensor keeps its own values
    ring.ring_reduce_scatter(work, op, group, counter)
    return ring.ring_all_gather(work, group, counter)
