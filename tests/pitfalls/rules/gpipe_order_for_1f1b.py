"""Exercise 6.1: GPipe's order."""

from __future__ import annotations

from minigpt.parallel.pipeline.schedule import Op


def one_f_one_b(stage: int, stages: int, micro_batches: int) -> list[Op]:
    # Mistake: GPipe's order; 1F1B starts each backward as early as it can, to hold at most stages - stage
    return [("F", i) for i in range(micro_batches)] + [("B", i) for i in range(micro_batches)]
