"""Lab 02 pitfalls: three classic mistakes, each to be caught by exactly its own tests.

* ``device_memory`` forgets the working buffer, and offloads only the optimizer state (not the
  gradient shards it updates from stage 2 on);
* ``zero2_step`` keeps each unit's whole gradient (as ZeRO-1 does): right weights, wrong memory;
* ``step_collectives`` all-reduces the whole gradient across HSDP replicas instead of the shard;
* the ZeRO-1 ``step`` updates every piece, also those of a parameter that received no gradient
  (its gradient is zero, so it seems harmless, but AdamW's weight decay and both optimizers'
  momentum move it; ``torch.optim`` would skip it).

tests/pitfalls/zero1_keeps_frozen/ holds a ZeRO-1 whose flat buffers keep the frozen parameters.
"""

from __future__ import annotations

import torch

from minigpt.parallel import ring
from minigpt.parallel.zero1 import ZeroOneOptimizer as _Reference, trainable_parameters  # noqa: F401
from minigpt.zero.comm import Collective
from minigpt.zero.memory import DeviceMemory, recipe
from minigpt.zero.simulate import Cluster, _forward_whole


def device_memory(
    psi: float,
    n_devices: int,
    stage: int,
    recipe_name: str = "mixed",
    largest_layer: float = 0,
    offload_optimizer: bool = False,
    offload_params: bool = False,
) -> DeviceMemory:
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


def step_collectives(
    psi: float,
    stage: int,
    shard_degree: int,
    replicas: int = 1,
    recipe_name: str = "mixed",
    reshard_after_forward: bool = True,
) -> list[Collective]:
    rec = recipe(recipe_name)
    if stage == 0:
        if replicas != 1:
            raise ValueError("DDP does not shard")
        return [Collective("all-reduce", "gradients", "data", shard_degree, psi, rec.reduce_bytes)]
    group = "data" if replicas == 1 else "shard"
    gathers = 2 if stage == 3 and reshard_after_forward else 1
    out = [
        Collective("reduce-scatter", "gradients", group, shard_degree, psi, rec.reduce_bytes),
        Collective("all-gather", "weights", group, shard_degree, psi, rec.param_bytes, gathers),
    ]
    if replicas > 1:
        out.append(Collective("all-reduce", "gradients", "replica", replicas, psi, rec.reduce_bytes))
    return out


class ZeroOneOptimizer(_Reference):
    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        # Mistake: every piece steps, with a zero gradient where no rank had one.
        self.reduce_gradients()
        for group, local in zip(self.param_groups, self.local.param_groups):
            local.update({k: v for k, v in group.items() if k != "params"})
        self.local.step()
        for flat in self.flat_params:
            ring.ring_all_gather(flat, self.process_group, self.counter)
        self._reduced = False
        return loss
