"""Two Lab 01 mistakes that break the whole DDP (graded by tests/test_grader.py): the hook's
argument taken for the gradient, and buckets that keep frozen parameters and list tied weights
twice. The ring is the reference's."""

from __future__ import annotations

from torch import nn

from minigpt.parallel.ddp import BucketedDDP as _Reference
from minigpt.parallel.ring import ring_all_reduce  # noqa: F401  (correct: this folder is about the DDP)


def assign_buckets(module: nn.Module, bucket_cap_bytes: int) -> list[list[tuple[str, nn.Parameter]]]:
    # Mistake: every name of every parameter, frozen or not, so tied weights appear twice and a
    # frozen parameter waits for a gradient that never comes.
    buckets, current, size = [], [], 0
    for name, p in reversed(list(module.named_parameters(remove_duplicate=False))):
        if current and (p.dtype, p.device) != (current[0][1].dtype, current[0][1].device):
            buckets.append(current)  # one dtype per bucket: this much is right
            current, size = [], 0
        current.append((name, p))
        size += p.numel() * p.element_size()
        if size >= bucket_cap_bytes:
            buckets.append(current)
            current, size = [], 0
    return buckets + [current] if current else buckets


class BucketedDDP(_Reference):
    assign_buckets = staticmethod(assign_buckets)

    def _on_grad_ready(self, param: nn.Parameter) -> None:
        # Mistake: the hook hands over the parameter, and this puts the parameter's values
        # (not its .grad) into the bucket.
        if self._sync_this_backward:
            param.grad = param.detach().clone()
        super()._on_grad_ready(param)
