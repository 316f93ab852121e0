"""Exercise 1.2: A bucket closed before the parameter that would pass the cap, not when it reaches it."""

from __future__ import annotations

from torch import nn

from minigpt.parallel.ddp import BucketedDDP as _Reference, named_trainable_parameters


def assign_buckets(module: nn.Module, bucket_cap_bytes: int) -> list[list[tuple[str, nn.Parameter]]]:
    buckets, current, current_bytes = [], [], 0
    for name, p in reversed(named_trainable_parameters(module)):
        size = p.numel() * p.element_size()
        same = not current or (p.dtype, p.device) == (current[0][1].dtype, current[0][1].device)
        if current and (not same or current_bytes + size > bucket_cap_bytes):  # Mistake: "would pass", not "reached"
            buckets.append(current)
            current, current_bytes = [], 0
        current.append((name, p))
        current_bytes += size
    return buckets + ([current] if current else [])


class BucketedDDP(_Reference):
    assign_buckets = staticmethod(assign_buckets)
