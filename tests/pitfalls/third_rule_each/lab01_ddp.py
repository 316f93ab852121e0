"""A third stated rule broken at a time (see lab00_baseline.py here).

Lab 01: an op other than "sum" and "avg" taken as "sum" instead of refused (1.1); the buckets filled
in registration order, not in reverse, so the first bucket to fill is the one backward reaches last
(1.2); every bucket launched only once the last gradient of the backward is ready, so no all-reduce
overlaps backward (1.3).
"""

from __future__ import annotations

import torch
from torch import nn

from minigpt.parallel import ring
from minigpt.parallel.ddp import BucketedDDP as _Reference, named_trainable_parameters


def ring_all_reduce(tensor: torch.Tensor, op: str = "sum", group=None, counter=None) -> torch.Tensor:
    ring.ring_reduce_scatter(tensor, "avg" if op == "avg" else "sum", group, counter)  # Mistake: "max" summed
    return ring.ring_all_gather(tensor, group, counter)


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

    def _on_grad_ready(self, param: nn.Parameter) -> None:
        if not self._sync_this_backward:
            return
        if not self._backward_started:
            self._backward_started = True
            self._next_bucket = 0
            for bucket in self.buckets:
                bucket.reset()
            torch.autograd.Variable._execution_engine.queue_callback(self.finish_gradient_synchronization)
        bucket = self.buckets[self._bucket_of[id(param)]]
        bucket.ready.add(id(param))
        if bucket.first_ready_s is None:
            bucket.first_ready_s = self._now()
        if bucket.is_full():
            bucket.last_ready_s = self._now()
        if all(b.is_full() for b in self.buckets):  # Mistake: waits for the whole backward before launching
            while self._next_bucket < len(self.buckets):
                self._launch(self.buckets[self._next_bucket])
                self._next_bucket += 1
