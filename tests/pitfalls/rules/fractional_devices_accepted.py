"""Exercise 2.1: 2.5 devices accepted."""

from __future__ import annotations

from minigpt.zero import memory


def device_memory(
    psi, n_devices, stage, recipe_name="mixed", largest_layer=0, offload_optimizer=False, offload_params=False
):
    if isinstance(n_devices, float) and n_devices >= 1:  # Mistake: a float number of devices accepted
        whole = memory.device_memory(psi, 1, stage, recipe_name, largest_layer, offload_optimizer, offload_params)
        return memory.DeviceMemory(**{k: v / n_devices if k in ("grads",) else v for k, v in vars(whole).items()})
    return memory.device_memory(psi, n_devices, stage, recipe_name, largest_layer, offload_optimizer, offload_params)
