"""Plausible wrong answers to the Lab 01 exercises, each mistake caught by its own tests.

tests/test_grader.py grades this folder and checks that each mistake loses exactly the points of
the tests written to catch it. The mistakes here leave the rest working: the bucket assignment is
right for one dtype but puts a parameter of another dtype in the same bucket (one flat buffer holds
one dtype); the DDP is right except for four slips that public courses and first attempts make.
tests/pitfalls/broken_ddp/ holds the mistakes that break everything downstream.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from minigpt.parallel.ddp import Bucket, BucketedDDP as _Reference, _Pending, named_trainable_parameters  # noqa: F401
from minigpt.parallel.ring import COUNTER, ByteCounter, exchange, ring_position


def ring_all_reduce(
    tensor: torch.Tensor, op: str = "sum", group: dist.ProcessGroup | None = None, counter: ByteCounter | None = None
) -> torch.Tensor:
    # Mistake: a "ring" that passes whole tensors. Each rank forwards what it last received and
    # adds it up; the sum is right, but every step moves all S elements: (N-1)*S bytes instead
    # of 2(N-1)/N*S. With 2 ranks the two costs are equal; from 3 ranks on it loses.
    if op not in ("sum", "avg"):
        raise ValueError(f"op {op!r} is not supported")
    position = ring_position(group)
    flat = tensor.view(-1)
    travelling = flat.clone()
    for _ in range(position.world_size - 1):
        incoming = torch.empty_like(flat)
        exchange(position, travelling, incoming, counter or COUNTER)
        flat += incoming
        travelling = incoming
    if op == "avg":
        flat /= position.world_size
    return tensor


def assign_buckets(module: nn.Module, bucket_cap_bytes: int) -> list[list[tuple[str, nn.Parameter]]]:
    # Mistake: the dtype (and device) never close a bucket: a float64 parameter joins a bucket of
    # float32 ones, which one flat buffer cannot hold. Right for MiniGPT, whose parameters are all
    # float32.
    buckets, current, current_bytes = [], [], 0
    for name, p in reversed(named_trainable_parameters(module)):
        current.append((name, p))
        current_bytes += p.numel() * p.element_size()
        if current_bytes >= bucket_cap_bytes:
            buckets.append(current)
            current, current_bytes = [], 0
    return buckets + ([current] if current else [])


class BucketedDDP(_Reference):
    def _on_grad_ready(self, param: nn.Parameter) -> None:
        # Mistake 1: no check of self._sync_this_backward, so no_sync() does nothing.
        # Mistake 2: each bucket is launched the moment it is full, in the order gradients
        # arrive; on two ranks whose gradients arrive in different orders, the all-reduces pair
        # up the wrong buckets.
        if not self._backward_started:
            self._backward_started = True
            self._next_bucket = 0
            for bucket in self.buckets:
                bucket.reset()
            torch.autograd.Variable._execution_engine.queue_callback(self.finish_gradient_synchronization)
        bucket = self.buckets[self._bucket_of[id(param)]]
        bucket.ready.add(id(param))
        bucket.first_ready_s = bucket.first_ready_s or self._now()
        bucket.last_ready_s = self._now()
        if bucket.is_full():
            self._launch(bucket)
            self._next_bucket += 1

    def finish_gradient_synchronization(self) -> None:
        # Mistake 3: no check for buckets that were never launched: waiting on a handle that
        # does not exist, instead of an error naming the parameter without a gradient.
        # Mistake 4: the averages copied back into the gradients autograd made, instead of making
        # each .grad its slot: right values, and a second copy of every gradient in memory.
        if not self._backward_started:
            return
        self._backward_started = False
        for bucket in self.buckets:
            bucket.handle.wait()
            for p, view in zip(bucket.params, bucket.views):
                p.grad.copy_(view)
        self.bytes_all_reduced = sum(b.nbytes for b in self.buckets)
        self.steps_synchronised += 1
