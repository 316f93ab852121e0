"""Exercise 6.3: A degree of 2.5 taken."""

from __future__ import annotations

from minigpt.parallel.mesh.degrees import resolve_hsdp as _resolve


def resolve_hsdp(world_size, local_world_size, shard=None, replicate=None):
    if shard is not None and replicate is None and shard >= 1 and world_size % shard == 0 and shard != int(shard):
        return world_size / shard, shard  # Mistake: only shard >= 1 and world_size % shard were checked
    return _resolve(world_size, local_world_size, shard, replicate)
