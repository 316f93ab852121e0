"""A third stated rule broken at a time (see lab00_baseline.py here).

Lab 02: n_devices checked to be at least 1 but not to be a whole number, so 2.5 devices are accepted
(2.1).
"""

from __future__ import annotations

from minigpt.parallel.zero1 import ZeroOneOptimizer, trainable_parameters  # noqa: F401
from minigpt.zero import memory
from minigpt.zero.comm import step_collectives  # noqa: F401
from minigpt.zero.simulate import zero2_step  # noqa: F401


def device_memory(
    psi, n_devices, stage, recipe_name="mixed", largest_layer=0, offload_optimizer=False, offload_params=False
):
    if isinstance(n_devices, float) and n_devices >= 1:  # Mistake: a float number of devices accepted
        whole = memory.device_memory(psi, 1, stage, recipe_name, largest_layer, offload_optimizer, offload_params)
        return memory.DeviceMemory(**{k: v / n_devices if k in ("grads",) else v for k, v in vars(whole).items()})
    return memory.device_memory(psi, n_devices, stage, recipe_name, largest_layer, offload_optimizer, offload_params)
