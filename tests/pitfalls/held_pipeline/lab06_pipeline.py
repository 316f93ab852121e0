"""Lab 06, one mistake: backward_step reads ``held[i]`` instead of taking it out (6.2).

The gradients are right and every byte is sent, but the stage keeps every micro-batch's activations
and graph until the end of the step, which is what 1F1B exists to avoid. The test of what a stage
holds catches it, naming the micro-batches still held. Everything else is the reference's.
"""

from __future__ import annotations

from minigpt.parallel.pipeline.engine import forward_step  # noqa: F401
from minigpt.parallel.pipeline.link import Link
from minigpt.parallel.pipeline.schedule import one_f_one_b  # noqa: F401
from minigpt.parallel.pipeline.stage import PipelineStage


def backward_step(stage: PipelineStage, i: int, link: Link, held: dict[int, tuple]) -> None:
    inputs, outputs = held[i]  # Mistake: read, not popped: the stage still holds micro-batch i
    if stage.is_last:
        outputs.backward()
    else:
        outputs.backward(link.recv_gradient(i))
    if not stage.is_first:
        link.send_gradient(inputs.grad, i)
