"""Exercise 3.3."""

from __future__ import annotations

from minigpt.fsdp import practice


def units_of_policy(model, policy: str):
    if policy == "block":
        return list(model.blocks)[::-1]  # Mistake: the blocks in reverse order
    return practice.units_of_policy(model, policy)
