"""A third stated rule broken at a time (see lab00_baseline.py here).

Lab 06: every collective's bytes rounded before they are added up, instead of each total rounded
once at the end (6.4); both degrees given taken as they are, their product never compared with the
world size (6.3).
"""

from __future__ import annotations

from minigpt.parallel.mesh.degrees import resolve_hsdp as _resolve


def hsdp_bytes_per_dim(unit_sizes, shard, replicate, param_bytes=4, grad_bytes=4, reshard_after_forward=None):
    from minigpt.zero import comm

    collectives = comm.unit_collectives(
        unit_sizes, 3, shard, param_bytes, grad_bytes, reshard_after_forward, pad=False, replicas=replicate
    )
    return {  # Mistake: each collective rounded, then summed
        "shard": sum(round(c.bytes_sent) for c in collectives if c.group != "replica"),
        "replicate": sum(round(c.bytes_sent) for c in collectives if c.group == "replica"),
    }


def resolve_hsdp(world_size, local_world_size, shard=None, replicate=None):
    if isinstance(shard, int) and isinstance(replicate, int) and shard >= 1 and replicate >= 1:
        return replicate, shard  # Mistake: both given, taken as they are; their product must be the world size
    return _resolve(world_size, local_world_size, shard, replicate)
