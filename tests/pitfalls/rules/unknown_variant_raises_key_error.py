"""Exercise 3.1: An unknown variant: a KeyError."""

from __future__ import annotations

from minigpt.fsdp import variants


def predict_event_order(n_blocks: int, variant: str) -> list[str]:
    variants.VARIANTS[variant]  # Mistake: a KeyError for an unknown variant; the rule is a ValueError
    return variants.predict_event_order(n_blocks, variant)
