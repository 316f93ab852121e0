"""A fourth stated rule broken at a time (see lab00_baseline.py here).

Lab 06: 1F1B's cool-down stops one backward short: the last micro-batch's B never runs (6.1); a
middle stage's backward started from ones instead of the gradient the next stage sent (6.2).
"""

from __future__ import annotations

import torch

from minigpt.parallel.pipeline.engine import forward_step  # noqa: F401
from minigpt.parallel.pipeline.schedule import Op, one_f_one_b as _one_f_one_b


def one_f_one_b(stage: int, stages: int, micro_batches: int) -> list[Op]:
    return _one_f_one_b(stage, stages, micro_batches)[:-1]  # Mistake: the last backward dropped


def backward_step(stage, i: int, link, held: dict) -> None:
    inputs, outputs = held.pop(i)
    if stage.is_last:
        outputs.backward()
    else:
        link.recv_gradient(i)  # Mistake: received, then not used: backward from ones
        outputs.backward(torch.ones_like(outputs))
    if not stage.is_first:
        link.send_gradient(inputs.grad, i)
