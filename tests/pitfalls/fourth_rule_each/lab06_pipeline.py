"""A fourth stated rule broken at a time (see lab00_baseline.py here).

Lab 06: 1F1B's cool-down stops one backward short: the last micro-batch's B never runs (6.1).
"""

from __future__ import annotations

from minigpt.parallel.pipeline.schedule import Op, one_f_one_b as _one_f_one_b


def one_f_one_b(stage: int, stages: int, micro_batches: int) -> list[Op]:
    return _one_f_one_b(stage, stages, micro_batches)[:-1]  # Mistake: the last backward dropped
