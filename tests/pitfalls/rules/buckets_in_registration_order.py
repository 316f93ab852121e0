"""Exercise 1.2: Buckets filled in registration order: each 1.2 test expects the reverse order."""

from __future__ import annotations

from torch import nn

from minigpt.parallel.ddp import BucketedDDP as _Reference, named_trainable_parameters


def assign_buckets(module: nn.Module, bucket_cap_bytes: int) -> list[list[tuple[str, nn.Parameter]]]:
    buckets, current, current_bytes = [], [], 0
    for name, p in named_trainable_parameters(module):  # Mistake: registration order, not reversed
        same = not current or (p.dtype, p.device) == (current[0][1].dtype, current[0][1].device)
        if current and not same:
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
