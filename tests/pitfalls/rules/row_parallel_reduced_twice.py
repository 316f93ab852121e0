"""Exercise 5.1: Reduce twice."""

from __future__ import annotations

from torch.nn import functional as F


def row_parallel_linear(x, weight, bias, reduce):
    y = reduce(reduce(F.linear(x, weight)))  # Mistake: reduce called twice; the rule is exactly once
    return y if bias is None else y + bias
