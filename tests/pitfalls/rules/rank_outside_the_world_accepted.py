"""Exercise 0.3: A rank outside 0..N-1 not refused."""

from __future__ import annotations


def rank_slice(batch_size: int, rank: int, world_size: int) -> slice:
    if world_size < 1:
        raise ValueError(f"world_size must be at least 1, got {world_size}")
    if batch_size % world_size:
        raise ValueError(f"the global batch size {batch_size} is not divisible by the world size {world_size}")
    per_rank = batch_size // world_size
    return slice(rank * per_rank, (rank + 1) * per_rank)  # Mistake: a rank outside 0..N-1 is not refused
