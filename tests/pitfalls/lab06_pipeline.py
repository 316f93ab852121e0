"""Lab 06 pitfalls: two classic mistakes, each to be caught by exactly its own tests.

* 1F1B's warm-up counted from the wrong end (``stage`` forwards instead of ``stages - 1 - stage``):
  the last stage waits for a forward the first one never starts, a deadlock that check_schedule
  names before anything is sent - 6.1;
* the received activations used as they come, without ``requires_grad_()``: backward computes no
  gradient for them, so there is nothing to send back (a middle stage has ``None``) - 6.2.

Everything else is the reference's. (The input's gradient never sent back is
tests/pitfalls/unsent_gradient_pipeline/.)
"""

from __future__ import annotations

from minigpt.parallel.pipeline.engine import MicroBatches, backward_step  # noqa: F401
from minigpt.parallel.pipeline.link import Link
from minigpt.parallel.pipeline.schedule import Op
from minigpt.parallel.pipeline.stage import PipelineStage


def one_f_one_b(stage: int, stages: int, micro_batches: int) -> list[Op]:
    warmup = min(stage, micro_batches)  # counted from the wrong end: the last stage warms up the most
    ops: list[Op] = [("F", i) for i in range(warmup)]
    for i in range(warmup, micro_batches):
        ops += [("F", i), ("B", i - warmup)]
    return ops + [("B", i) for i in range(micro_batches - warmup, micro_batches)]


def forward_step(
    stage: PipelineStage, i: int, batches: MicroBatches, link: Link, held: dict[int, tuple], scale: float
) -> float | None:
    inputs = batches.tokens[i] if stage.is_first else link.recv_activation(i)  # no requires_grad_()
    outputs = stage(inputs)
    if stage.is_last:
        loss = stage.loss(outputs, batches.targets[i], batches.masks[i])
        held[i] = (None if stage.is_first else inputs, loss * scale)
        return loss.item()
    link.send_activation(outputs.detach(), i)
    held[i] = (None if stage.is_first else inputs, outputs)
    return None
