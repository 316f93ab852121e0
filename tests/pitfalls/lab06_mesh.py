"""Lab 06 pitfalls, the mesh half: two classic mistakes, each to be caught by exactly its own tests.

* the two degrees swapped: the shard group laid across the nodes and the replica groups inside one
  (every replica group built across the wrong ranks) - 6.3;
* the gradients all-reduced over the whole world instead of the replica group: the whole unit, not
  the reduced shard, over replicate x shard ranks - 6.4.
"""

from __future__ import annotations

from fractions import Fraction

from minigpt.parallel.mesh.degrees import resolve_hsdp as _resolve


def resolve_hsdp(world_size, local_world_size, shard=None, replicate=None):
    replicas, shards = _resolve(world_size, local_world_size, shard, replicate)
    return shards, replicas  # (shard, replicate): the mesh's rows and columns exchanged


def hsdp_bytes_per_dim(unit_sizes, shard, replicate, param_bytes=4, grad_bytes=4, reshard_after_forward=None):
    reshard = [True] * len(unit_sizes) if reshard_after_forward is None else reshard_after_forward
    world = shard * replicate
    inside = across = Fraction(0)
    for size, again in zip(unit_sizes, reshard):
        inside += Fraction(shard - 1, shard) * size * ((2 if again else 1) * param_bytes + grad_bytes)
        across += Fraction(2 * (world - 1), world) * size * grad_bytes  # the whole world, the whole unit
    return {"shard": round(inside), "replicate": round(across)}
