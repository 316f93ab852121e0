"""Exercise 1.4: A second call not harmless."""

from __future__ import annotations

import torch.distributed as dist

from minigpt.parallel.ddp import BucketedDDP as _Reference


class BucketedDDP(_Reference):
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
