"""Exercise 2.4: A repeated parameter kept twice."""

from __future__ import annotations

from torch import nn

from minigpt.parallel.zero1 import ZeroOneOptimizer as _Scaffold


def trainable_parameters(params: list[nn.Parameter]) -> list[nn.Parameter]:
    return [p for p in params if p.requires_grad]  # Mistake: a parameter listed twice is kept twice


class ZeroOneOptimizer(_Scaffold):
    trainable_parameters = staticmethod(trainable_parameters)
