"""Exercise 2.1: Stage 2's gradients left whole: every stage-2 cell of the paper's table, and the recipes' test."""

from __future__ import annotations

from minigpt.zero import memory
from minigpt.zero.memory import DeviceMemory


def device_memory(
    psi, n_devices, stage, recipe_name="mixed", largest_layer=0, offload_optimizer=False, offload_params=False
) -> DeviceMemory:
    got = memory.device_memory(psi, n_devices, stage, recipe_name, largest_layer, offload_optimizer, offload_params)
    if stage == 2 and not offload_optimizer:  # Mistake: stage 2's gradients whole; the rule shards them from stage 2
        return DeviceMemory(**{**vars(got), "grads": got.grads * n_devices})
    return got
