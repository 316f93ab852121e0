"""A fourth stated rule broken at a time (see lab00_baseline.py here).

Lab 05: column_slice cuts a fused ``[q | k | v]`` weight as one block (rank 0 gets all of q and part of
k) instead of taking its run of each of the ``parts`` parts (5.1); the vocabulary-parallel loss sums
``exp(z)`` with no maximum subtracted: right for small logits, ``inf`` for logits in the thousands
(5.3); the online softmax takes each block's maximum from ``scores`` itself, not ``scores.detach()``,
so the running maximum carries a gradient (5.4: the softmax comes out the same; the rule is broken).
"""

from __future__ import annotations

import torch

from minigpt.parallel.tensor_parallel import comm, layers
from minigpt.parallel.tensor_parallel.layers import row_parallel_linear, row_slice  # noqa: F401
from minigpt.parallel.tensor_parallel.ring_attention import block_mask  # noqa: F401


def column_slice(weight, bias, tp: int, rank: int, parts: int = 1):
    return layers.column_slice(weight, bias, tp, rank, 1)  # Mistake: parts ignored, one block cut tp ways


class _Unshifted(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, targets, start, vocab_size, group, counter):
        z = logits.detach()
        columns = torch.arange(start, start + z.shape[-1], device=z.device)
        exp = torch.exp(z).masked_fill(columns >= vocab_size, 0.0)  # Mistake: exp(z) unshifted: exp(3000) = inf
        local = targets - start
        inside = (local >= 0) & (local < z.shape[-1])
        mine = z.gather(-1, local.clamp(0, z.shape[-1] - 1).unsqueeze(-1)).squeeze(-1)
        sums = comm.all_reduce(torch.stack([exp.sum(dim=-1), torch.where(inside, mine, 0.0)]), group, counter)
        ctx.save_for_backward(exp / sums[0].unsqueeze(-1), local, inside)
        return torch.log(sums[0]) - sums[1]

    backward = staticmethod(layers._VocabParallelCrossEntropy.backward)  # softmax - onehot, as the rule says


def vocab_parallel_cross_entropy(logits, targets, start, vocab_size, group=None, counter=None):
    return _Unshifted.apply(logits, targets, start, vocab_size, group, counter)


def online_softmax_step(m, total, acc, scores, v):
    top = scores.amax(dim=-1)  # Mistake: not scores.detach(): the running maximum carries a gradient
    if m is not None:
        top = torch.maximum(m, top)
    p = torch.exp(scores - top.unsqueeze(-1))
    if m is None:
        return top, p.sum(dim=-1), p @ v
    shrink = torch.exp(m - top)
    return top, total * shrink + p.sum(dim=-1), acc * shrink.unsqueeze(-1) + p @ v
