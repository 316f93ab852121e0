"""Exercise 6.1: The newest B first."""

from __future__ import annotations

from minigpt.parallel.pipeline.schedule import Op


def one_f_one_b(stage: int, stages: int, micro_batches: int) -> list[Op]:
    warmup = min(stages - 1 - stage, micro_batches)
    ops: list[Op] = [("F", i) for i in range(warmup)]
    for i in range(warmup, micro_batches):
        ops += [("F", i), ("B", i)]  # Mistake: the newest micro-batch's B; the rule is the oldest's
    return ops + [("B", i) for i in range(warmup)]
