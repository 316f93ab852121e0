"""A second stated rule broken at a time (see lab00_baseline.py here).

Lab 05: a row-parallel cut that does not divide the input features taken anyway, the last rank getting
the columns left over, instead of a ValueError (5.1).
"""

from __future__ import annotations

import torch

from minigpt.parallel.tensor_parallel.layers import column_slice, row_parallel_linear  # noqa: F401


def row_slice(weight: torch.Tensor, bias: torch.Tensor | None, tp: int, rank: int):
    per = weight.shape[1] // tp
    stop = weight.shape[1] if rank == tp - 1 else (rank + 1) * per  # Mistake: uneven cut, no ValueError
    return weight[:, rank * per : stop].clone(), None if bias is None else bias.detach().clone()
