"""Exercise 6.1: The last B dropped: not every micro-batch's B, so not 1F1B's order either."""

from __future__ import annotations

from minigpt.parallel.pipeline.schedule import Op, one_f_one_b as _one_f_one_b


def one_f_one_b(stage: int, stages: int, micro_batches: int) -> list[Op]:
    return _one_f_one_b(stage, stages, micro_batches)[:-1]  # Mistake: the last backward dropped
