"""A second stated rule broken at a time (see lab00_baseline.py here).

Lab 02: the weights offloaded at any stage, although they are sharded (and so offloadable) only at
stage 3 (2.1); stage 0 given replicas, although DDP does not shard and so cannot replicate shards (2.3).
"""

from __future__ import annotations

from minigpt.parallel.zero1 import ZeroOneOptimizer, trainable_parameters  # noqa: F401
from minigpt.zero import comm, memory
from minigpt.zero.memory import DeviceMemory
from minigpt.zero.simulate import zero2_step  # noqa: F401


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
