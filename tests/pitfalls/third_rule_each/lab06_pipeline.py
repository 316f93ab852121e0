"""A third stated rule broken at a time (see lab00_baseline.py here).

Lab 06: 1F1B's steady state runs the backward of the micro-batch it has just sent forward (the
newest) instead of the oldest one waiting (6.1); the last stage keeps the micro-batch's loss for
backward without the 1/m scale, so the step's gradients are m times too large (6.2).
"""

from __future__ import annotations

from minigpt.parallel.pipeline.engine import backward_step  # noqa: F401
from minigpt.parallel.pipeline.schedule import Op


def one_f_one_b(stage: int, stages: int, micro_batches: int) -> list[Op]:
    warmup = min(stages - 1 - stage, micro_batches)
    ops: list[Op] = [("F", i) for i in range(warmup)]
    for i in range(warmup, micro_batches):
        ops += [("F", i), ("B", i)]  # Mistake: the newest micro-batch's B; the rule is the oldest's
    return ops + [("B", i) for i in range(warmup)]


def forward_step(stage, i: int, batches, link, held: dict, scale: float):
    inputs = batches.tokens[i] if stage.is_first else link.recv_activation(i).requires_grad_()
    outputs = stage(inputs)
    if stage.is_last:
        loss = stage.loss(outputs, batches.targets[i], batches.masks[i])
        held[i] = (None if stage.is_first else inputs, loss)  # Mistake: loss * scale is what backward needs
        return loss.item()
    link.send_activation(outputs.detach(), i)
    held[i] = (None if stage.is_first else inputs, outputs)
    return None
