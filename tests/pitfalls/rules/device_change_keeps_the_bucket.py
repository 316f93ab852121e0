"""Exercise 1.2: Another device does not close the bucket."""

from __future__ import annotations

from torch import nn

from minigpt.parallel.ddp import BucketedDDP as _Reference, named_trainable_parameters


def assign_buckets(module: nn.Module, bucket_cap_bytes: int) -> list[list[tuple[str, nn.Parameter]]]:
    buckets, current, current_bytes = [], [], 0
    for name, p in reversed(named_trainable_parameters(module)):
        if current and p.dtype != current[0][1].dtype:  # Mistake: the device is not compared
            buckets.append(current)
            current, current_bytes = [], 0
        current.append((name, p))
        current_bytes += p.numel() * p.element_size()
        if current_bytes >= bucket_cap_bytes:
            buckets.append(current)
            current, current_bytes = [], 0
    return buckets + ([current] if current else [])


class BucketedDDP(_Reference):
    assign_buckets = staticmethod(assign_buckets)
