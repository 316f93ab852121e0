"""Lab 05, one mistake: f's backward all-reduces on the default group, not on the group it is given - 5.2.

On a world that is one tensor-parallel group the two are the same ranks, and nothing shows. With two
groups side by side, {0, 1} and {2, 3}, each on its own data, the gradient of f's input is summed
over all four ranks: the shares of ranks that hold the same columns on other data are added in.
Everything else is the reference's.
"""

from __future__ import annotations

import torch

from minigpt.parallel.ring import ByteCounter
from minigpt.parallel.tensor_parallel import comm
from minigpt.parallel.tensor_parallel.comm import Group, reduce_from_tp  # noqa: F401
from minigpt.parallel.tensor_parallel.layers import (  # noqa: F401
    column_slice,
    row_parallel_linear,
    row_slice,
    vocab_parallel_cross_entropy,
)
from minigpt.parallel.tensor_parallel.ring_attention import block_mask, online_softmax_step  # noqa: F401


class _CopyOnTheWorld(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, group: Group, counter: ByteCounter | None) -> torch.Tensor:
        ctx.counter = counter  # the group is dropped
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return comm.all_reduce(grad, None, ctx.counter), None, None  # the default group: every rank


def copy_to_tp(x: torch.Tensor, group: Group = None, counter: ByteCounter | None = None) -> torch.Tensor:
    return _CopyOnTheWorld.apply(x, group, counter)
