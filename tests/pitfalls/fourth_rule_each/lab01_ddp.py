"""A fourth stated rule broken at a time (see lab00_baseline.py here).

Lab 01: the ring's result returned in a new tensor, the one given left as it was (the rule: reduced
in place, and that same tensor returned) (1.1); ``collective="ring"`` ignored: every bucket goes to
gloo's all-reduce, and the learner's ring never runs (1.3).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from minigpt.parallel import ring
from minigpt.parallel.ddp import BucketedDDP as _Reference, _Pending


def ring_all_reduce(tensor: torch.Tensor, op: str = "sum", group=None, counter=None) -> torch.Tensor:
    work = tensor.clone()  # Mistake: a copy is reduced; the caller's tensor keeps its own values
    ring.ring_reduce_scatter(work, op, group, counter)
    return ring.ring_all_gather(work, group, counter)


class BucketedDDP(_Reference):
    def _launch(self, bucket) -> None:
        bucket.launched_s = self._now()
        torch._foreach_copy_(bucket.views, [p.grad for p in bucket.params])
        bucket.buffer.div_(self.world_size)
        work = dist.all_reduce(bucket.buffer, group=self.process_group, async_op=True)  # Mistake: the ring ignored
        work.get_future().then(lambda *_: setattr(bucket, "done_s", self._now()))
        bucket.handle = _Pending(work=work)
