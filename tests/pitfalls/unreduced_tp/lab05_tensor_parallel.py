"""Lab 05, one mistake: f without its backward all-reduce (the identity both ways) - 5.2.

Each rank keeps only its own share of the input's gradient (what flowed back through its own
columns of the next weight). Everything else is the reference's.
"""

from __future__ import annotations

import torch

from minigpt.parallel.ring import ByteCounter
from minigpt.parallel.tensor_parallel.comm import Group, reduce_from_tp  # noqa: F401
from minigpt.parallel.tensor_parallel.layers import (  # noqa: F401
    column_slice,
    row_parallel_linear,
    row_slice,
    vocab_parallel_cross_entropy,
)
from minigpt.parallel.tensor_parallel.ring_attention import block_mask, online_softmax_step  # noqa: F401


class _Identity(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, group: Group, counter: ByteCounter | None) -> torch.Tensor:
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad, None, None  # no all-reduce: this rank's share only


def copy_to_tp(x: torch.Tensor, group: Group = None, counter: ByteCounter | None = None) -> torch.Tensor:
    return _Identity.apply(x, group, counter)
