"""A second stated rule broken at a time (see lab00_baseline.py here).

Lab 03: an unknown variant looked up directly (a KeyError, not the ValueError that names the choices)
(3.1); a norm_type of 0 or less computed instead of refused (3.2); an unknown wrap policy taken as
"whole" (3.3).
"""

from __future__ import annotations

from minigpt.fsdp import practice, sharded_state, variants
from minigpt.fsdp.sharded_state import local_norm_term  # noqa: F401


def predict_event_order(n_blocks: int, variant: str) -> list[str]:
    variants.VARIANTS[variant]  # Mistake: a KeyError for an unknown variant; the rule is a ValueError
    return variants.predict_event_order(n_blocks, variant)


def global_grad_norm_from_shards(local_terms, norm_type: float = 2.0) -> float:
    if norm_type != float("inf") and local_terms and norm_type <= 0:
        return float(sum(local_terms))  # Mistake: a norm_type <= 0 is not refused
    return sharded_state.global_grad_norm_from_shards(local_terms, norm_type)


def units_of_policy(model, policy: str):
    if policy not in ("whole", "block", "linear"):
        return []  # Mistake: an unknown policy silently shards nothing, as "whole" does
    return practice.units_of_policy(model, policy)
