"""Lab 02 pitfalls: three classic mistakes, each to be caught by exactly its own tests.

* ``device_memory`` forgets the working buffer, and offloads only the optimizer state (not the
  gradient shards it updates from stage 2 on);
* ``zero2_step`` keeps each unit's whole gradient (as ZeRO-1 does): right weights, wrong memory;
* ``step_collectives`` all-reduces the whole gradient across HSDP replicas instead of the shard.
"""

from __future__ import annotations

from minigpt.zero.comm import Collective
from minigpt.zero.memory import DeviceMemory, recipe
from minigpt.zero.simulate import Cluster, _forward_whole


def device_memory(psi: float, n_devices: int, stage: int, recipe_name: str = "mixed",
                  largest_layer: float = 0, offload_optimizer: bool = False,
                  offload_params: bool = False) -> DeviceMemory:
    if not psi > 0 or not isinstance(n_devices, int) or n_devices < 1 or stage not in (0, 1, 2, 3):
        raise ValueError("bad input")
    if offload_params and stage != 3:
        raise ValueError("offload_params needs stage 3")
    rec = recipe(recipe_name)
    n = n_devices
    params = rec.param_bytes * psi / (n if stage >= 3 else 1)
    grads = rec.grad_bytes * psi / (n if stage >= 2 else 1)
    optimizer = rec.optimizer_bytes * psi / (n if stage >= 1 else 1)
    host_params = host_optimizer = 0.0
    if offload_optimizer:
        host_optimizer, optimizer = optimizer, 0.0
    if offload_params:
        host_params, params = params, 0.0
    return DeviceMemory(params, grads, optimizer, 0.0, host_params, 0.0, host_optimizer)


def zero2_step(c: Cluster, xs: list, ys: list, rows: int, step: int) -> float:
    loss = _forward_whole(c, xs, ys, rows)
    for u in reversed(c.units):
        grads = [w.hold(f"whole{u}", "gradients", c.backward_unit(w, u, w.get(f"weights{u}"))) for w in c.workers]
        c.reduce_scatter(grads, u)
        for w, grad in zip(c.workers, grads):
            w.get(f"gradshard{u}")[...] = grad[c.chunk(u, w.rank)]
    for w in c.workers:
        c.finish_backward(w)
        for u in c.units:
            c.adam_update(w, u, w.get(f"weights{u}"), c.chunk(u, w.rank), w.get(f"gradshard{u}"), step)
            w.drop(f"whole{u}")
    for u in c.units:
        c.all_gather([w.get(f"weights{u}") for w in c.workers], u)
    return loss


def step_collectives(psi: float, stage: int, shard_degree: int, replicas: int = 1,
                     recipe_name: str = "mixed", reshard_after_forward: bool = True) -> list[Collective]:
    rec = recipe(recipe_name)
    if stage == 0:
        if replicas != 1:
            raise ValueError("DDP does not shard")
        return [Collective("all-reduce", "gradients", "data", shard_degree, psi, rec.reduce_bytes)]
    group = "data" if replicas == 1 else "shard"
    gathers = 2 if stage == 3 and reshard_after_forward else 1
    out = [Collective("reduce-scatter", "gradients", group, shard_degree, psi, rec.reduce_bytes),
           Collective("all-gather", "weights", group, shard_degree, psi, rec.param_bytes, gathers)]
    if replicas > 1:
        out.append(Collective("all-reduce", "gradients", "replica", replicas, psi, rec.reduce_bytes))
    return out
