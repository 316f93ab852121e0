"""Exercise 6.3."""

from __future__ import annotations

from minigpt.parallel.mesh.degrees import resolve_hsdp as _resolve


def resolve_hsdp(world_size, local_world_size, shard=None, replicate=None):
    if (
        replicate is not None
        and shard is None
        and isinstance(replicate, int)
        and replicate >= 1
        and not world_size % replicate
    ):
        return replicate, local_world_size  # Mistake: shard = the node's ranks, not world_size / replicate
    return _resolve(world_size, local_world_size, shard, replicate)
