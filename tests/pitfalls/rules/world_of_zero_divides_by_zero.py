"""Exercise 0.3: A world of 0 divides by zero."""

from __future__ import annotations


def rank_slice(batch_size: int, rank: int, world_size: int) -> slice:
    if batch_size % world_size:  # Mistake: a world of 0 divides by zero here; check world_size >= 1 first
        raise ValueError(f"the global batch size {batch_size} is not divisible by the world size {world_size}")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be in 0..{world_size - 1}, got {rank}")
    per_rank = batch_size // world_size
    return slice(rank * per_rank, (rank + 1) * per_rank)
