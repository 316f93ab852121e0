"""Exercise 7.3: The fused q, k, v weight joined as one block."""

from __future__ import annotations

import torch


def whole_parameter(pieces, rows, tp_dim, parts=1):
    slices = [torch.cat(list(by_shard), dim=0)[:rows] for by_shard in pieces]
    if tp_dim is None:
        return slices[0]
    return torch.cat(slices, dim=tp_dim)  # [q0 k0 v0 q1 k1 v1], not [q0 q1 k0 k1 v0 v1]
