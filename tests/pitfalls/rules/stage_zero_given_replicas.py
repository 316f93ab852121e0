"""Exercise 2.3: Stage 0 given replicas, not refused."""

from __future__ import annotations

from minigpt.zero import comm


def step_collectives(psi, stage, shard_degree, replicas=1, recipe_name="mixed", reshard_after_forward=True):
    if stage == 0 and replicas != 1:  # Mistake: no refusal; the replicas are ignored
        replicas = 1
    return comm.step_collectives(psi, stage, shard_degree, replicas, recipe_name, reshard_after_forward)
