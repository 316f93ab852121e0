"""A fourth stated rule broken at a time (see lab00_baseline.py here).

Lab 05: column_slice cuts a fused ``[q | k | v]`` weight as one block (rank 0 gets all of q and part of
k) instead of taking its run of each of the ``parts`` parts (5.1).
"""

from __future__ import annotations

from minigpt.parallel.tensor_parallel import layers
from minigpt.parallel.tensor_parallel.layers import row_parallel_linear, row_slice  # noqa: F401


def column_slice(weight, bias, tp: int, rank: int, parts: int = 1):
    return layers.column_slice(weight, bias, tp, rank, 1)  # Mistake: parts ignored, one block cut tp ways
