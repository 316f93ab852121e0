"""Exercise 6.4: FSDP2 keeps the root gathered after forward: its bytes need the flags too."""

from __future__ import annotations

from minigpt.parallel.mesh import hsdp


def hsdp_bytes_per_dim(unit_sizes, shard, replicate, param_bytes=4, grad_bytes=4, reshard_after_forward=None):
    return hsdp.hsdp_bytes_per_dim(unit_sizes, shard, replicate, param_bytes, grad_bytes)  # Mistake: flags dropped
