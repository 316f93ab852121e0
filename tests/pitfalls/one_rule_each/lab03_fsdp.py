"""One stated rule broken at a time (see lab00_baseline.py here).

Lab 03: FSDP1 predicted with FSDP2's post-backward rule, every block reduce-scattering right after
its own backward: right for every variant but FSDP1 with forward_prefetch, where a block gathered
during the previous block's forward reduce-scatters only after that block's backward (the guide's
"A surprise") (3.1); this rank's norm term of a DTensor taken from the DTensor itself instead of its
local shard (``t.to_local()``) (3.2).
"""

from __future__ import annotations

import dataclasses

import torch

from minigpt.fsdp import variants
from minigpt.fsdp.practice import units_of_policy  # noqa: F401
from minigpt.fsdp.sharded_state import global_grad_norm_from_shards  # noqa: F401


def predict_event_order(n_blocks: int, variant: str) -> list[str]:
    if variant not in variants.VARIANTS:
        raise ValueError(f"unknown variant {variant!r}; choose from {', '.join(variants.VARIANTS)}")
    chosen = variants.VARIANTS[variant]
    variants.VARIANTS[variant] = dataclasses.replace(chosen, api="fsdp2")  # Mistake: FSDP1's surprise ignored
    try:
        return variants.predict_event_order(n_blocks, variant)
    finally:
        variants.VARIANTS[variant] = chosen


def local_norm_term(tensors, norm_type: float = 2.0) -> float:
    values = [t.detach().double().abs().flatten() for t in tensors]  # Mistake: a DTensor used whole, no to_local()
    flat = torch.cat(values) if values else torch.zeros(0, dtype=torch.float64)
    if norm_type == float("inf"):
        return float(flat.max()) if flat.numel() else 0.0
    return float((flat**norm_type).sum())
