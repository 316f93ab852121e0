"""A second stated rule broken at a time (see lab00_baseline.py here).

Lab 06: a degree checked to be at least 1 but not to be a whole number, so shard=2.5 on a world of 5
gives replicate = 2.0 instead of a ValueError (6.3); the reduce-scatter's bytes counted at the
weights' size per element, not the gradients' (6.4).
"""

from __future__ import annotations

from minigpt.parallel.mesh import hsdp
from minigpt.parallel.mesh.degrees import resolve_hsdp as _resolve


def resolve_hsdp(world_size, local_world_size, shard=None, replicate=None):
    if shard is not None and replicate is None and shard >= 1 and world_size % shard == 0 and shard != int(shard):
        return world_size / shard, shard  # Mistake: only shard >= 1 and world_size % shard were checked
    return _resolve(world_size, local_world_size, shard, replicate)


def hsdp_bytes_per_dim(unit_sizes, shard, replicate, param_bytes=4, grad_bytes=4, reshard_after_forward=None):
    # Mistake: the gradients counted at param_bytes per element
    return hsdp.hsdp_bytes_per_dim(unit_sizes, shard, replicate, param_bytes, param_bytes, reshard_after_forward)
