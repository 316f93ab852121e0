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

from minigpt.parallel import ring
from minigpt.parallel.zero1 import ZeroOneOptimizer as _Scaffold, trainable_parameters  # noqa: F401
from minigpt.zero import comm, memory
from minigpt.zero.memory import DeviceMemory
from minigpt.zero.simulate import _forward_whole


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
    loss = _forward_whole(c, xs, ys, rows)
    for u in reversed(c.units):
        grads = [w.hold("unitgrad", "working", c.backward_unit(w, u, w.get(f"weights{u}"))) for w in c.workers]
        c.all_reduce(grads, u)  # Mistake: the whole sum on every worker, where each needs only its chunk's
        c.record(f"backward {u}", f"all-reduce gradients {u}")
        for w, grad in zip(c.workers, grads):
            w.get(f"gradshard{u}")[...] = grad[c.chunk(u, w.rank)]
            w.drop("unitgrad")
    for w in c.workers:
        c.finish_backward(w)
        for u in c.units:
            c.adam_update(w, u, w.get(f"weights{u}"), c.chunk(u, w.rank), w.get(f"gradshard{u}"), step)
    c.record("update")
    for u in c.units:
        c.all_gather([w.get(f"weights{u}") for w in c.workers], u)
        c.record(f"all-gather {u}", f"all-gather weights {u}")
    return loss


class ZeroOneOptimizer(_Scaffold):
    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self.reduce_gradients()
        # Mistake: the inner groups keep the settings they were built with; the schedule's lr never arrives
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
        for flat in self.flat_params:
            ring.ring_all_gather(flat, self.process_group, self.counter)
        self._reduced = False
        return loss
