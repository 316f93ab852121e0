"""A Lab 02 mistake graded on its own (tests/test_grader.py): a ZeRO-1 whose flat buffers keep the
frozen parameters. The optimizer never steps them (no rank marks them as having a gradient), so
the weights come out right; the memory does not. Everything else is the reference."""

from __future__ import annotations

from torch import nn

from minigpt.parallel.zero1 import ZeroOneOptimizer as _Reference
from minigpt.zero.comm import step_collectives  # noqa: F401
from minigpt.zero.memory import device_memory  # noqa: F401
from minigpt.zero.simulate import zero2_step  # noqa: F401


def trainable_parameters(params: list[nn.Parameter]) -> list[nn.Parameter]:
    # Mistake: each parameter once, but frozen ones too.
    seen, kept = set(), []
    for p in params:
        if id(p) not in seen:
            seen.add(id(p))
            kept.append(p)
    return kept


class ZeroOneOptimizer(_Reference):
    trainable_parameters = staticmethod(trainable_parameters)
