"""Exercise 1.1: "avg" never divided."""

from __future__ import annotations

from minigpt.parallel import ring


def ring_all_reduce(tensor, op: str = "sum", group=None, counter=None):
    if op not in ("sum", "avg"):
        raise ValueError(f"op {op!r} is not supported; use sum or avg")
    ring.ring_reduce_scatter(tensor, "sum", group, counter)  # Mistake: "avg" never divided by the world size
    return ring.ring_all_gather(tensor, group, counter)
