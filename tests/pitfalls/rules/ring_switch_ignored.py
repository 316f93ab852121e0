"""Exercise 1.3: Collective="ring" ignored."""

from __future__ import annotations

import torch
import torch.distributed as dist

from minigpt.parallel.ddp import BucketedDDP as _Reference, _Pending


class BucketedDDP(_Reference):
    def _launch(self, bucket) -> None:
        bucket.launched_s = self._now()
        torch._foreach_copy_(bucket.views, [p.grad for p in bucket.params])
        bucket.buffer.div_(self.world_size)
        work = dist.all_reduce(bucket.buffer, group=self.process_group, async_op=True)  # Mistake: the ring ignored
        work.get_future().then(lambda *_: setattr(bucket, "done_s", self._now()))
        bucket.handle = _Pending(work=work)
