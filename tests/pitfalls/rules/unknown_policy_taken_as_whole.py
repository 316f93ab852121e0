"""Exercise 3.3: An unknown policy taken as "whole"."""

from __future__ import annotations

from minigpt.fsdp import practice


def units_of_policy(model, policy: str):
    if policy not in ("whole", "block", "linear"):
        return []  # Mistake: an unknown policy silently shards nothing, as "whole" does
    return practice.units_of_policy(model, policy)
