"""Exercise 2.1: The weights offloaded below stage 3."""

from __future__ import annotations

from minigpt.zero import memory
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
