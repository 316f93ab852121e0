"""Exercise 2.5: The weights all-reduced from zeros, not all-gathered."""

from __future__ import annotations

import torch
import torch.distributed as dist

from minigpt.parallel import ring
from minigpt.parallel.zero1 import ZeroOneOptimizer as _Scaffold


class ZeroOneOptimizer(_Scaffold):
    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self.reduce_gradients()
        for group, local in zip(self.param_groups, self.local.param_groups):
            local.update({k: v for k, v in group.items() if k != "params"})
        skipped = []
        for flat in self.groups:
            if flat is None:
                continue
            for piece, i in zip(flat.pieces, flat.piece_params):
                if not self.used[self._index[id(flat.params[i])]]:
                    skipped.append((piece, piece.grad))
                    piece.grad = None
        self.local.step()
        for piece, grad in skipped:
            piece.grad = grad
        rank, world = dist.get_rank(self.process_group), dist.get_world_size(self.process_group)
        for flat in self.flat_params:
            start, stop = ring.chunk_bounds(flat.numel(), world)[rank]
            flat[:start] = 0
            flat[stop:] = 0
            ring.ring_all_reduce(flat, "sum", self.process_group, self.counter)  # Mistake: not an all-gather
        self._reduced = False
        return loss
