"""Exercise 2.3: A shard degree of 2.5 rounded down, not refused."""

from __future__ import annotations

from minigpt.zero import comm


def step_collectives(psi, stage, shard_degree, replicas=1, recipe_name="mixed", reshard_after_forward=True):
    if shard_degree < 1 or replicas < 1:  # Mistake: at least 1 checked, a whole number not: 2.5 is rounded down
        raise ValueError(f"the degrees must be at least 1, got shard_degree={shard_degree}, replicas={replicas}")
    return comm.step_collectives(psi, stage, int(shard_degree), int(replicas), recipe_name, reshard_after_forward)
