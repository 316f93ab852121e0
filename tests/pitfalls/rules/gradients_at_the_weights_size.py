"""Exercise 6.4: Gradients counted at the weights' size."""

from __future__ import annotations

from minigpt.parallel.mesh import hsdp


def hsdp_bytes_per_dim(unit_sizes, shard, replicate, param_bytes=4, grad_bytes=4, reshard_after_forward=None):
    # Mistake: the gradients counted at param_bytes per element
    return hsdp.hsdp_bytes_per_dim(unit_sizes, shard, replicate, param_bytes, param_bytes, reshard_after_forward)
