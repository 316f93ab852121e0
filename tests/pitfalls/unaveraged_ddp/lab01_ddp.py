"""A classic Lab 01 mistake on its own: the buckets are summed over the ranks, never divided by the
world size. Everything else is the reference.

Every rank ends with the same gradients (the ranks stay in step, nothing crashes), twice too
large on 2 ranks. AdamW divides each update by the gradient's own size, so a short training run
looks almost right: only the tests that compare the gradients themselves catch it, and the
end-to-end test must be one of them (tests/test_grader.py checks the points it loses).
"""

from __future__ import annotations

import torch

from minigpt.parallel.ddp import Bucket, BucketedDDP as _Reference, _Pending, assign_buckets  # noqa: F401
from minigpt.parallel.ring import ring_all_reduce  # noqa: F401


class BucketedDDP(_Reference):
    def _launch(self, bucket: Bucket) -> None:
        bucket.launched_s = self._now()
        torch._foreach_copy_(bucket.views, [p.grad for p in bucket.params])
        # Mistake: no division by self.world_size, so the all-reduce leaves the sum, not the average
        self._start_all_reduce(bucket)
