"""One stated rule broken at a time (see lab00_baseline.py here).

Lab 01: a bucket closed before the parameter that would take it past the cap, instead of when it
*reaches* the cap: a small bias below the cap travels alone, in a message of its own (1.2); "avg"
returned as the sum, never divided by the world size (1.1); the end of synchronisation without its
"nothing in flight" guard, so a second call waits on buckets already finished (1.4).
"""

from __future__ import annotations

import torch.distributed as dist
from torch import nn

from minigpt.parallel import ring
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


def ring_all_reduce(tensor, op: str = "sum", group=None, counter=None):
    if op not in ("sum", "avg"):
        raise ValueError(f"op {op!r} is not supported; use sum or avg")
    ring.ring_reduce_scatter(tensor, "sum", group, counter)  # Mistake: "avg" never divided by the world size
    return ring.ring_all_gather(tensor, group, counter)


class BucketedDDP(_Reference):
    assign_buckets = staticmethod(assign_buckets)

    def finish_gradient_synchronization(self) -> None:
        # Mistake: no "if not self._backward_started: return": a second call waits on finished buckets
        self._backward_started = False
        unlaunched = self.buckets[self._next_bucket :]
        if unlaunched:
            missing = [name for b in unlaunched for p, name in zip(b.params, b.names) if id(p) not in b.ready]
            for bucket in self.buckets[: self._next_bucket]:
                bucket.handle.wait()
            raise RuntimeError(f"rank {dist.get_rank()}: these parameters received no gradient: {', '.join(missing)}")
        for bucket in self.buckets:
            bucket.handle.wait()
            bucket.done_s = bucket.done_s or self._now()
            self._bucket_into_gradients(bucket)
            bucket.handle = None
        self.bytes_all_reduced = sum(b.nbytes for b in self.buckets)
        self.steps_synchronised += 1
