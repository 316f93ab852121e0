"""A fourth stated rule broken at a time (see lab00_baseline.py here).

Lab 01: the ring's result returned in a new tensor, the one given left as it was (the rule: reduced
in place, and that same tensor returned) (1.1); ``collective="ring"`` ignored: every bucket goes to
gloo's all-reduce, and the learner's ring never runs (1.3); a bucket closed on another dtype but not
on another device, so one flat buffer would have to live on two devices (1.2).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from minigpt.parallel import ring
from minigpt.parallel.ddp import BucketedDDP as _Reference, _Pending, named_trainable_parameters


def ring_all_reduce(tensor: torch.Tensor, op: str = "sum", group=None, counter=None) -> torch.Tensor:
    work = tensor.clone()  # Mistake: a copy is reduced; the caller's tensor keeps its own values
    ring.ring_reduce_scatter(work, op, group, counter)
    return ring.ring_all_gather(work, group, counter)


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

    def _launch(self, bucket) -> None:
        bucket.launched_s = self._now()
        torch._foreach_copy_(bucket.views, [p.grad for p in bucket.params])
        bucket.buffer.div_(self.world_size)
        work = dist.all_reduce(bucket.buffer, group=self.process_group, async_op=True)  # Mistake: the ring ignored
        work.get_future().then(lambda *_: setattr(bucket, "done_s", self._now()))
        bucket.handle = _Pending(work=work)
