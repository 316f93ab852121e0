"""A fourth stated rule broken at a time (see lab00_baseline.py here).

Lab 01: the ring's result returned in a new tensor, the one given left as it was (the rule: reduced
in place, and that same tensor returned) (1.1).
"""

from __future__ import annotations

import torch

from minigpt.parallel import ring
from minigpt.parallel.ddp import BucketedDDP  # noqa: F401


def ring_all_reduce(tensor: torch.Tensor, op: str = "sum", group=None, counter=None) -> torch.Tensor:
    work = tensor.clone()  # Mistake: a copy is reduced; the caller's tensor keeps its own values
    ring.ring_reduce_scatter(work, op, group, counter)
    return ring.ring_all_gather(work, group, counter)
