"""Exercise 2.3: ZeRO-3 gathers once."""

from __future__ import annotations

from minigpt.zero import comm
from minigpt.zero.comm import Collective


def step_collectives(psi, stage, shard_degree, replicas=1, recipe_name="mixed", reshard_after_forward=True):
    out = comm.step_collectives(psi, stage, shard_degree, replicas, recipe_name, reshard_after_forward)
    # Mistake: one all-gather of the weights at every stage; stage 3 with reshard_after_forward gathers twice
    return [Collective(c.op, c.what, c.group, c.group_size, c.elements, c.element_bytes, 1) for c in out]
