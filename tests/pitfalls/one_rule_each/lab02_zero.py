"""One stated rule broken at a time (see lab00_baseline.py here).

Lab 02: ZeRO-3's weights gathered once a step even when they are freed after forward (count=1 instead
of 2 with reshard_after_forward) (2.3); a parameter listed twice kept twice (no check of identity) (2.4);
stage 2's gradients left whole, sharded only from stage 3 with the weights (2.1); the ZeRO-1 step
calls the closure under its own no_grad, where a closure's backward has no graph to run (torch.optim
calls it under torch.enable_grad()) (2.5).
"""

from __future__ import annotations

import torch
from torch import nn

from minigpt.parallel.zero1 import ZeroOneOptimizer as _Scaffold
from minigpt.zero import comm, memory
from minigpt.zero.comm import Collective
from minigpt.zero.memory import DeviceMemory
from minigpt.zero.simulate import zero2_step  # noqa: F401


def step_collectives(psi, stage, shard_degree, replicas=1, recipe_name="mixed", reshard_after_forward=True):
    out = comm.step_collectives(psi, stage, shard_degree, replicas, recipe_name, reshard_after_forward)
    # Mistake: one all-gather of the weights at every stage; stage 3 with reshard_after_forward gathers twice
    return [Collective(c.op, c.what, c.group, c.group_size, c.elements, c.element_bytes, 1) for c in out]


def trainable_parameters(params: list[nn.Parameter]) -> list[nn.Parameter]:
    return [p for p in params if p.requires_grad]  # Mistake: a parameter listed twice is kept twice


class ZeroOneOptimizer(_Scaffold):
    trainable_parameters = staticmethod(trainable_parameters)

    @torch.no_grad()
    def step(self, closure=None):
        loss = None if closure is None else closure()  # Mistake: called under step's no_grad, not enable_grad
        super().step()
        return loss


def device_memory(
    psi, n_devices, stage, recipe_name="mixed", largest_layer=0, offload_optimizer=False, offload_params=False
) -> DeviceMemory:
    got = memory.device_memory(psi, n_devices, stage, recipe_name, largest_layer, offload_optimizer, offload_params)
    if stage == 2 and not offload_optimizer:  # Mistake: stage 2's gradients whole; the rule shards them from stage 2
        return DeviceMemory(**{**vars(got), "grads": got.grads * n_devices})
    return got
