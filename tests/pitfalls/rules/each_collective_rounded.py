"""Exercise 6.4: Each collective rounded, then summed."""

from __future__ import annotations


def hsdp_bytes_per_dim(unit_sizes, shard, replicate, param_bytes=4, grad_bytes=4, reshard_after_forward=None):
    from minigpt.zero import comm

    collectives = comm.unit_collectives(
        unit_sizes, 3, shard, param_bytes, grad_bytes, reshard_after_forward, pad=False, replicas=replicate
    )
    return {  # Mistake: each collective rounded, then summed
        "shard": sum(round(c.bytes_sent) for c in collectives if c.group != "replica"),
        "replicate": sum(round(c.bytes_sent) for c in collectives if c.group == "replica"),
    }
