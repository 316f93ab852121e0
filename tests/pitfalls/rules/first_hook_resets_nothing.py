"""Exercise 1.3: The first hook resets nothing: a 2nd backward."""

from __future__ import annotations

import torch

from minigpt.parallel.ddp import BucketedDDP as _Reference


class BucketedDDP(_Reference):
    def _on_grad_ready(self, param) -> None:
        if not self._sync_this_backward:
            return
        if not self._backward_started:
            self._backward_started = True  # Mistake: neither self._next_bucket nor the buckets reset
            torch.autograd.Variable._execution_engine.queue_callback(self.finish_gradient_synchronization)
        bucket = self.buckets[self._bucket_of[id(param)]]
        bucket.ready.add(id(param))
        if bucket.first_ready_s is None:
            bucket.first_ready_s = self._now()
        if bucket.is_full():
            bucket.last_ready_s = self._now()
            while self._next_bucket < len(self.buckets) and self.buckets[self._next_bucket].is_full():
                self._launch(self.buckets[self._next_bucket])
                self._next_bucket += 1
