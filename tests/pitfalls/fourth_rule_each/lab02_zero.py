"""A fourth stated rule broken at a time (see lab00_baseline.py here).

Lab 02: the ZeRO-1 step leaves ``self._reduced`` as ``reduce_gradients`` set it, True, instead of
clearing it. The weights come out right here, because ``zero_grad()`` clears it before every backward;
a loop that accumulates into the gradients without ``zero_grad()`` would see the next
``reduce_gradients`` return at once and step on gradients never reduced (2.5).
"""

from __future__ import annotations

import torch

from minigpt.parallel.zero1 import ZeroOneOptimizer as _Scaffold


class ZeroOneOptimizer(_Scaffold):
    @torch.no_grad()
    def step(self, closure=None):
        loss = super().step(closure)
        self._reduced = True  # Mistake: the reference's last line, self._reduced = False, left out
        return loss
