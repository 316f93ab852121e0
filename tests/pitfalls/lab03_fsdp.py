"""Lab 03 pitfalls: three classic mistakes, each to be caught by exactly its own tests.

* BACKWARD_POST taken for BACKWARD_PRE (the prefetch issued before a block's backward, not after);
* the global norm taken as the largest rank's local norm (each rank clipping by its own shard);
* every Linear made a unit, the tied output layer included.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch
from torch import nn

from minigpt.fsdp import sharded_state, variants
from minigpt.model import MiniGPT


def predict_event_order(n_blocks: int, variant: str) -> list[str]:
    if variant == "fsdp1-backward-post":
        variant = "fsdp1-backward-pre"
    return variants.predict_event_order(n_blocks, variant)


def local_norm_term(tensors: Iterable[torch.Tensor], norm_type: float = 2.0) -> float:
    return sharded_state.local_norm_term(tensors, norm_type)


def global_grad_norm_from_shards(local_terms: Sequence[float], norm_type: float = 2.0) -> float:
    if not local_terms or not norm_type > 0:
        raise ValueError("bad input")
    if norm_type == float("inf"):
        return max(local_terms)
    return max(t ** (1 / norm_type) for t in local_terms)


def units_of_policy(model: MiniGPT, policy: str) -> list[nn.Module]:
    if policy == "whole":
        return []
    if policy == "block":
        return list(model.blocks)
    if policy == "linear":
        return [m for m in model.modules() if isinstance(m, nn.Linear)]
    raise ValueError(f"unknown policy {policy!r}")
