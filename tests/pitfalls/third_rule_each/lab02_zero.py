"""A third stated rule broken at a time (see lab00_baseline.py here).

Lab 02: n_devices checked to be at least 1 but not to be a whole number, so 2.5 devices are accepted
(2.1); the summed gradient shard divided by the number of workers before Adam, as if the sum still
had to become a mean (the loss already divides by the global row count, so the sum is the gradient):
Adam's m / sqrt(v) almost cancels the factor, and only its eps term moves the weights, by 6e-6 to
2e-5 after 4 steps in fp32, which only a bit-for-bit comparison with DDP sees (2.2); step_collectives
checks that each degree is at least 1 but not that it is a whole number, so a shard group of 2.5
devices is rounded down instead of refused (2.3); the ZeRO-1 step puts the weights back together
with an all-reduce of each flat buffer, zeros outside this rank's chunk: the same bits (x + 0 = x),
but twice the bytes of the all-gather (2.5).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from minigpt.parallel import ring
from minigpt.parallel.zero1 import ZeroOneOptimizer as _Scaffold, trainable_parameters  # noqa: F401
from minigpt.zero import comm, memory, simulate


def device_memory(
    psi, n_devices, stage, recipe_name="mixed", largest_layer=0, offload_optimizer=False, offload_params=False
):
    if isinstance(n_devices, float) and n_devices >= 1:  # Mistake: a float number of devices accepted
        whole = memory.device_memory(psi, 1, stage, recipe_name, largest_layer, offload_optimizer, offload_params)
        return memory.DeviceMemory(**{k: v / n_devices if k in ("grads",) else v for k, v in vars(whole).items()})
    return memory.device_memory(psi, n_devices, stage, recipe_name, largest_layer, offload_optimizer, offload_params)


def zero2_step(c, xs, ys, rows, step):
    adam = c.adam_update

    def averaged_again(w, u, weights, where, grad, step):
        adam(w, u, weights, where, grad / c.n, step)  # Mistake: the summed shard divided by N a second time

    c.adam_update = averaged_again
    try:
        return simulate.zero2_step(c, xs, ys, rows, step)
    finally:
        del c.adam_update  # the cluster's own method again


def step_collectives(psi, stage, shard_degree, replicas=1, recipe_name="mixed", reshard_after_forward=True):
    if shard_degree < 1 or replicas < 1:  # Mistake: at least 1 checked, a whole number not: 2.5 is rounded down
        raise ValueError(f"the degrees must be at least 1, got shard_degree={shard_degree}, replicas={replicas}")
    return comm.step_collectives(psi, stage, int(shard_degree), int(replicas), recipe_name, reshard_after_forward)


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
