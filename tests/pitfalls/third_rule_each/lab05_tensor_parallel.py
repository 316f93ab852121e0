"""A third stated rule broken at a time (see lab00_baseline.py here).

Lab 05: row_slice cuts the bias into tp equal parts as if each rank added its share (the rule: the
bias whole, added once after the sum) (5.1); g written as the identity forward, so the row-parallel
layer's partial products are never summed (5.2).
"""

from __future__ import annotations

import torch

from minigpt.parallel.tensor_parallel import layers
from minigpt.parallel.tensor_parallel.comm import Group, copy_to_tp  # noqa: F401
from minigpt.parallel.tensor_parallel.layers import column_slice, row_parallel_linear  # noqa: F401


def row_slice(weight: torch.Tensor, bias: torch.Tensor | None, tp: int, rank: int):
    w, b = layers.row_slice(weight, bias, tp, rank)
    return w, None if b is None else b / tp  # Mistake: a tp-th of the bias; the rule keeps it whole


class _NotReduced(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        return x.view_as(x)  # Mistake: g's all-reduce left out; each rank keeps its own term

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad


def reduce_from_tp(x: torch.Tensor, group: Group = None, counter=None) -> torch.Tensor:
    return _NotReduced.apply(x)
