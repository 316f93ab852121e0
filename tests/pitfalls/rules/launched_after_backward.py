"""Exercise 1.3: Launched once the whole backward is done."""

from __future__ import annotations

import torch
from torch import nn

from minigpt.parallel.ddp import BucketedDDP as _Reference


class BucketedDDP(_Reference):
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
