"""A second stated rule broken at a time (see lab00_baseline.py here).

Lab 05: a row-parallel cut that does not divide the input features taken anyway, the last rank getting
the columns left over, instead of a ValueError (5.1); g that all-reduces the gradient in backward too,
instead of passing it through (5.2).
"""

from __future__ import annotations

import torch

from minigpt.parallel.tensor_parallel import comm
from minigpt.parallel.tensor_parallel.comm import copy_to_tp  # noqa: F401
from minigpt.parallel.tensor_parallel.layers import column_slice, row_parallel_linear  # noqa: F401


def row_slice(weight: torch.Tensor, bias: torch.Tensor | None, tp: int, rank: int):
    per = weight.shape[1] // tp
    stop = weight.shape[1] if rank == tp - 1 else (rank + 1) * per  # Mistake: uneven cut, no ValueError
    return weight[:, rank * per : stop].clone(), None if bias is None else bias.detach().clone()


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
