"""Exercise 5.2: G sums the gradient in backward too: the MLP's gradients are then tp times too large."""

from __future__ import annotations

import torch

from minigpt.parallel.tensor_parallel import comm


class _SumsBothWays(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group, counter):
        ctx.group, ctx.counter = group, counter
        return comm.all_reduce(x, group, counter)

    @staticmethod
    def backward(ctx, grad):
        return comm.all_reduce(grad, ctx.group, ctx.counter), None, None  # Mistake: g's backward is the identity


def reduce_from_tp(x, group=None, counter=None):
    return _SumsBothWays.apply(x, group, counter)
