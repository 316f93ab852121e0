"""Exercise 2.5: The settings never copied into the inner groups: the lr schedule never reaches the pieces."""

from __future__ import annotations

import torch

from minigpt.parallel.zero1 import ZeroOneOptimizer as _Scaffold


class ZeroOneOptimizer(_Scaffold):
    @torch.no_grad()
    def step(self, closure=None):
        # Mistake: the inner groups keep the settings they were built with, so the schedule's lr never arrives
        # (written here as the reference's step with its copy made a no-op: each group shows the inner one's settings)
        given = [dict(group) for group in self.param_groups]
        for group, inner in zip(self.param_groups, self.local.param_groups):
            group.update({k: v for k, v in inner.items() if k != "params"})
        try:
            return _Scaffold.step(self, closure)
        finally:
            for group, settings in zip(self.param_groups, given):
                group.update(settings)
