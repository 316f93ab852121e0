"""Exercise 0.3."""

from __future__ import annotations


def rank_slice(batch_size: int, rank: int, world_size: int) -> slice:
    if world_size < 1:
        raise ValueError(f"world_size must be at least 1, got {world_size}")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be in 0..{world_size - 1}, got {rank}")
    if batch_size % world_size:
        raise ValueError(f"the global batch size {batch_size} is not divisible by the world size {world_size}")
    return slice(rank, batch_size, world_size)  # Mistake: every N-th row, not rows r*B/N .. (r+1)*B/N - 1
