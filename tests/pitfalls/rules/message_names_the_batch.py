"""Exercise 0.3: The message names the batch, not the world size."""

from __future__ import annotations


def rank_slice(batch_size: int, rank: int, world_size: int) -> slice:
    if world_size < 1:
        raise ValueError(f"world_size must be at least 1, got {world_size}")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be in 0..{world_size - 1}, got {rank}")
    if batch_size % world_size:
        raise ValueError(f"the global batch size {batch_size} is not divisible")  # Mistake: the world size unnamed
    per_rank = batch_size // world_size
    return slice(rank * per_rank, (rank + 1) * per_rank)
