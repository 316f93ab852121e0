"""Exercise 5.2: G the identity forward: the partial products never summed."""

from __future__ import annotations

import torch

from minigpt.parallel.tensor_parallel.comm import Group


class _NotReduced(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        return x.view_as(x)  # Mistake: g's all-reduce left out; each rank keeps its own term

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad


def reduce_from_tp(x: torch.Tensor, group: Group = None, counter=None) -> torch.Tensor:
    return _NotReduced.apply(x)
