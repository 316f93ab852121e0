"""Exercise 3.1: FSDP1 predicted with FSDP2's post-backward rule."""

from __future__ import annotations

import dataclasses

from minigpt.fsdp import variants


def predict_event_order(n_blocks: int, variant: str) -> list[str]:
    if variant not in variants.VARIANTS:
        raise ValueError(f"unknown variant {variant!r}; choose from {', '.join(variants.VARIANTS)}")
    chosen = variants.VARIANTS[variant]
    variants.VARIANTS[variant] = dataclasses.replace(chosen, api="fsdp2")  # Mistake: FSDP1's surprise ignored
    try:
        return variants.predict_event_order(n_blocks, variant)
    finally:
        variants.VARIANTS[variant] = chosen
