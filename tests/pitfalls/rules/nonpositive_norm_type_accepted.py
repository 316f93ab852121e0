"""Exercise 3.2: Norm_type <= 0 not refused."""

from __future__ import annotations

from minigpt.fsdp import sharded_state


def global_grad_norm_from_shards(local_terms, norm_type: float = 2.0) -> float:
    if norm_type != float("inf") and local_terms and norm_type <= 0:
        return float(sum(local_terms))  # Mistake: a norm_type <= 0 is not refused
    return sharded_state.global_grad_norm_from_shards(local_terms, norm_type)
