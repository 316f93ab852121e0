"""Exercise 6.3: Both degrees taken unchecked."""

from __future__ import annotations

from minigpt.parallel.mesh.degrees import resolve_hsdp as _resolve


def resolve_hsdp(world_size, local_world_size, shard=None, replicate=None):
    if isinstance(shard, int) and isinstance(replicate, int) and shard >= 1 and replicate >= 1:
        return replicate, shard  # Mistake: both given, taken as they are; their product must be the world size
    return _resolve(world_size, local_world_size, shard, replicate)
