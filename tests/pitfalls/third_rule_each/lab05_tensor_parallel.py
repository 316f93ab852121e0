"""A third stated rule broken at a time (see lab00_baseline.py here).

Lab 05: row_slice cuts the bias into tp equal parts as if each rank added its share (the rule: the
bias whole, added once after the sum) (5.1); g written as the identity forward, so the row-parallel
layer's partial products are never summed (5.2); the loss's gradient without its one-hot: softmax
alone, as if no column were the target (5.3).
"""

from __future__ import annotations

import torch

from minigpt.parallel.tensor_parallel import comm, layers
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


class _Loss(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, targets, start, vocab_size, group, counter):
        local = logits.detach().clone()
        columns = torch.arange(start, start + local.shape[-1], device=local.device)
        local[..., columns >= vocab_size] = float("-inf")
        top = comm.all_reduce_max(local.amax(dim=-1), group, counter)
        exp = torch.exp(local - top.unsqueeze(-1))
        inside = (targets >= start) & (targets < start + local.shape[-1])
        picked = local.gather(-1, (targets - start).clamp(0, local.shape[-1] - 1).unsqueeze(-1)).squeeze(-1)
        picked = torch.where(inside, picked - top, torch.zeros_like(picked))
        sums = comm.all_reduce(torch.stack([exp.sum(dim=-1), picked]), group, counter)
        ctx.save_for_backward(exp / sums[0].unsqueeze(-1), targets - start, inside)
        return torch.log(sums[0]) - sums[1]

    @staticmethod
    def backward(ctx, grad):
        probs, local_targets, inside = ctx.saved_tensors
        g = probs.clone()
        # Mistake: the target's column keeps softmax; the rule subtracts 1 there (softmax - onehot)
        return g * grad.unsqueeze(-1), None, None, None, None, None


def vocab_parallel_cross_entropy(logits, targets, start, vocab_size, group=None, counter=None):
    return _Loss.apply(logits, targets, start, vocab_size, group, counter)
