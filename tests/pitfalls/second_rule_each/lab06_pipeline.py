"""A second stated rule broken at a time (see lab00_baseline.py here).

Lab 06: "1F1B" written as every forward, then every backward: each micro-batch runs once and nothing
deadlocks, but stage s holds all m micro-batches at once instead of at most stages - s (6.1).
"""

from __future__ import annotations

from minigpt.parallel.pipeline.schedule import Op


def one_f_one_b(stage: int, stages: int, micro_batches: int) -> list[Op]:
    # Mistake: GPipe's order; 1F1B starts each backward as early as it can, to hold at most stages - stage
    return [("F", i) for i in range(micro_batches)] + [("B", i) for i in range(micro_batches)]
