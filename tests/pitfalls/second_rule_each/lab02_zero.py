"""A second stated rule broken at a time (see lab00_baseline.py here).

Lab 02: the weights offloaded at any stage, although they are sharded (and so offloadable) only at
stage 3 (2.1); each unit's gradient all-reduced, then the worker's chunk kept: the right weights and
memory, but twice the bytes of the one reduce-scatter per unit that ZeRO-2 needs (2.2); stage 0 given
replicas, although DDP does not shard and so cannot replicate shards (2.3); the ZeRO-1 step never
copies the settings of ``self.param_groups`` into the inner optimizer's groups, so a learning-rate
schedule set on the optimizer never reaches the pieces (2.5).
"""

from __future__ import annotations

import torch

from minigpt.parallel.zero1 import ZeroOneOptimizer as _Scaffold, trainable_parameters  # noqa: F401
from minigpt.zero import comm, memory, simulate
from minigpt.zero.memory import DeviceMemory


def device_memory(
    psi, n_devices, stage, recipe_name="mixed", largest_layer=0, offload_optimizer=False, offload_params=False
) -> DeviceMemory:
    if not offload_params or stage == 3:
        return memory.device_memory(
            psi, n_devices, stage, recipe_name, largest_layer, offload_optimizer, offload_params
        )
    # Mistake: offload_params taken below stage 3 (the rule: a ValueError); the whole weights go to the host
    kept = memory.device_memory(psi, n_devices, stage, recipe_name, largest_layer, offload_optimizer)
    return DeviceMemory(**{**vars(kept), "host_params": kept.params, "params": 0.0})


def step_collectives(psi, stage, shard_degree, replicas=1, recipe_name="mixed", reshard_after_forward=True):
    if stage == 0 and replicas != 1:  # Mistake: no refusal; the replicas are ignored
        replicas = 1
    return comm.step_collectives(psi, stage, shard_degree, replicas, recipe_name, reshard_after_forward)


def zero2_step(c, xs, ys, rows, step):
    def all_reduced(buffers, unit):  # Mistake: the whole sum on every worker, where each needs only its chunk's
        type(c).reduce_scatter(c, buffers, unit)
        c.all_gather(buffers, unit)

    c.reduce_scatter = all_reduced
    try:
        return simulate.zero2_step(c, xs, ys, rows, step)
    finally:
        del c.reduce_scatter  # the cluster's own method again


class ZeroOneOptimizer(_Scaffold):
    @torch.no_grad()
    def step(self, closure=None):
        # Mistake: the inner groups keep the settings they were built with, so the schedule's lr never arrives
        # (written here as the reference's step with its copy made a no-op: each group shows the inner one's settings)
        given = [dict(group) for group in self.param_groups]
        for group, inner in zip(self.param_groups, self.local.param_groups):
            group.update({k: v for k, v in inner.items() if k != "params"})
        try:
            return super().step(closure)
        finally:
            for group, settings in zip(self.param_groups, given):
                group.update(settings)
