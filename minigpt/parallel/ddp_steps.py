"""The hand-rolled DDP built up one choice at a time: the versions Lab 01's benchmark holds against
PyTorch's DDP, so that the page can say what each choice bought.

:class:`~minigpt.parallel.ddp.BucketedDDP` makes three choices that the first version of this
course's DDP did not. Each class here undoes one more of them:

==============  ===================================================================================
version         what it does differently from the one above it
==============  ===================================================================================
BucketedDDP     the reference: buckets closed when they reach the cap, a full bucket's gradients
                moved into its buffer in one call (``torch._foreach_copy_``), gradients left as
                views of the buckets
CopyBack        after the all-reduce, copies the averages back into the parameters' own ``.grad``
                tensors (in one call per bucket too), as PyTorch does by default
                (``gradient_as_bucket_view=False``): one more pass over the gradients
CallPerTensor   ... and moves each gradient with a Python call of its own (``copy_`` per
                parameter, into the bucket at launch and back after the all-reduce): a few
                microseconds per call, whatever the tensor's size
BeforeTheCap    ... and closes a bucket *before* it would pass the cap, so a small tensor (a bias)
                that does not fit goes in a bucket of its own: twice the messages for an MLP
==============  ===================================================================================

``BeforeTheCap`` is the course's first version, as it was measured. Below them all,
:class:`NaiveDDP` is the baseline every version improves on: no buckets and no overlap, one
blocking all-reduce per gradient after backward.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from minigpt.parallel.ddp import Bucket, BucketedDDP, named_trainable_parameters


class CopyBack(BucketedDDP):
    """The reference, but the averages are copied back into the parameters' own gradient tensors."""

    def _bucket_into_gradients(self, bucket: Bucket) -> None:
        torch._foreach_copy_([p.grad for p in bucket.params], bucket.views)


class CallPerTensor(CopyBack):
    """... and every gradient goes into the bucket, and back, with a Python call of its own."""

    def _launch(self, bucket: Bucket) -> None:
        for p, view in zip(bucket.params, bucket.views):
            view.copy_(p.grad)
        bucket.buffer.div_(self.world_size)
        self._start_all_reduce(bucket)

    def _bucket_into_gradients(self, bucket: Bucket) -> None:
        for p, view in zip(bucket.params, bucket.views):
            p.grad.copy_(view)


def assign_buckets_before_the_cap(module: nn.Module, bucket_cap_bytes: int) -> list[list[tuple[str, nn.Parameter]]]:
    """The first version's rule: start a new bucket when the next parameter would take the current
    one past the cap (a parameter larger than the cap goes alone)."""
    buckets, current, current_bytes = [], [], 0
    for name, p in reversed(named_trainable_parameters(module)):
        size = p.numel() * p.element_size()
        if current and current_bytes + size > bucket_cap_bytes:
            buckets.append(current)
            current, current_bytes = [], 0
        current.append((name, p))
        current_bytes += size
    return buckets + [current] if current else buckets


class BeforeTheCap(CallPerTensor):
    """... and buckets are closed before they would pass the cap: the course's first version."""

    assign_buckets = staticmethod(assign_buckets_before_the_cap)


VERSIONS: dict[str, type[BucketedDDP]] = {
    "first version": BeforeTheCap,
    "+ buckets closed at the cap": CallPerTensor,
    "+ one call per bucket": CopyBack,
    "+ gradients as bucket views": BucketedDDP,
}


class NaiveDDP(nn.Module):
    """The baseline DDP improves on: after backward, one blocking all-reduce per gradient."""

    def __init__(self, module: nn.Module):
        super().__init__()
        self.module = module
        for tensor in [*module.parameters(), *module.buffers()]:
            dist.broadcast(tensor.data, src=0)

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def synchronise(self) -> None:
        world = dist.get_world_size()
        for p in self.module.parameters():
            if p.grad is not None:
                p.grad.div_(world)
                dist.all_reduce(p.grad)
