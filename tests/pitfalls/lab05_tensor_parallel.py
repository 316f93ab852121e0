"""Lab 05 pitfalls: four classic mistakes, each to be caught by exactly its own tests.

* the row-parallel bias added on every rank before the reduce (summed tp times) - 5.1;
* the all-reduce in the wrong direction: f all-reduces in forward and is the identity in backward
  (f written as g) - 5.2;
* a softmax merged without rescaling the old sums when the maximum moves - 5.4;
* the causal mask applied to the wrong block pairs: local positions, so every pair gets the
  diagonal block's triangle - 5.4.

Everything else is the reference's. (f the identity both ways is tests/pitfalls/unreduced_tp/: it
fails the same test as the wrong direction.)
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.nn import functional as F

from minigpt.parallel.ring import ByteCounter
from minigpt.parallel.tensor_parallel import comm
from minigpt.parallel.tensor_parallel.comm import Group, reduce_from_tp  # noqa: F401
from minigpt.parallel.tensor_parallel.layers import column_slice, row_slice, vocab_parallel_cross_entropy  # noqa: F401


def row_parallel_linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, reduce: Callable[[torch.Tensor], torch.Tensor]
) -> torch.Tensor:
    return reduce(F.linear(x, weight, bias))  # the bias inside every rank's term: counted tp times


class _WrongWay(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, group: Group, counter: ByteCounter | None) -> torch.Tensor:
        return comm.all_reduce(x, group, counter)  # f's all-reduce moved into forward

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad, None, None


def copy_to_tp(x: torch.Tensor, group: Group = None, counter: ByteCounter | None = None) -> torch.Tensor:
    return _WrongWay.apply(x, group, counter)


def online_softmax_step(
    m: torch.Tensor | None,
    total: torch.Tensor | None,
    acc: torch.Tensor | None,
    scores: torch.Tensor,
    v: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    block_max = scores.detach().amax(dim=-1)
    m_new = block_max if m is None else torch.maximum(m, block_max)
    p = torch.exp(scores - m_new.unsqueeze(-1))
    if m is None:
        return m_new, p.sum(dim=-1), p @ v
    return m_new, total + p.sum(dim=-1), acc + p @ v  # the old sums kept at the old maximum


def block_mask(q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
    # local positions: every pair gets the diagonal block's triangle
    return torch.ones(len(q_pos), len(k_pos), dtype=torch.bool).tril()
