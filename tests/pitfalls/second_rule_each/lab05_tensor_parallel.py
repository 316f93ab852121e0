"""A second stated rule broken at a time (see lab00_baseline.py here).

Lab 05: a row-parallel cut that does not divide the input features taken anyway, the last rank getting
the columns left over, instead of a ValueError (5.1); g that all-reduces the gradient in backward too,
instead of passing it through (5.2); the target's logit read on every rank, at a clamped column where
the target is not this rank's, so the sum adds the wrong logits (5.3).
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
        picked = picked - top  # Mistake: only the rank that holds the target's column may add it
        sums = comm.all_reduce(torch.stack([exp.sum(dim=-1), picked]), group, counter)
        ctx.save_for_backward(exp / sums[0].unsqueeze(-1), targets - start, inside)
        return torch.log(sums[0]) - sums[1]

    @staticmethod
    def backward(ctx, grad):
        probs, local_targets, inside = ctx.saved_tensors
        g = probs.clone()
        rows = inside.nonzero(as_tuple=True)
        g[(*rows, local_targets[rows])] -= 1.0
        return g * grad.unsqueeze(-1), None, None, None, None, None


def vocab_parallel_cross_entropy(logits, targets, start, vocab_size, group=None, counter=None):
    return _Loss.apply(logits, targets, start, vocab_size, group, counter)
