"""Exercise 2.5: Self._reduced left True after the step."""

from __future__ import annotations

import torch

from minigpt.parallel.zero1 import ZeroOneOptimizer as _Scaffold


class ZeroOneOptimizer(_Scaffold):
    @torch.no_grad()
    def step(self, closure=None):
        loss = _Scaffold.step(self, closure)
        self._reduced = True  # Mistake: the reference's last line, self._reduced = False, left out
        return loss
