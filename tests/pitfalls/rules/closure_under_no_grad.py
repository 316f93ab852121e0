"""Exercise 2.5: The closure called under step's no_grad."""

from __future__ import annotations

import torch

from minigpt.parallel.zero1 import ZeroOneOptimizer as _Scaffold


class ZeroOneOptimizer(_Scaffold):
    @torch.no_grad()
    def step(self, closure=None):
        loss = None if closure is None else closure()  # Mistake: called under step's no_grad, not enable_grad
        _Scaffold.step(self)
        return loss
