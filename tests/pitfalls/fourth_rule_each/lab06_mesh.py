"""A fourth stated rule broken at a time (see lab00_baseline.py here).

Lab 06: with only the replicate degree given, the shard degree still taken from the node
(``local_world_size``) instead of the world size divided by the replicate degree (6.3); every unit
gathered twice whatever ``reshard_after_forward`` says (6.4).
"""

from __future__ import annotations

from minigpt.parallel.mesh import hsdp
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


def hsdp_bytes_per_dim(unit_sizes, shard, replicate, param_bytes=4, grad_bytes=4, reshard_after_forward=None):
    return hsdp.hsdp_bytes_per_dim(unit_sizes, shard, replicate, param_bytes, grad_bytes)  # Mistake: flags dropped
