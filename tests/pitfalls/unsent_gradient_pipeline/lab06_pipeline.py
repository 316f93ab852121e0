"""Lab 06, one mistake: backward_step never sends the input's gradient back - 6.2.

The stage before waits for it in its own backward until the receive's timeout, which names the
stage, the micro-batch and the neighbour it waited for. Everything else is the reference's.
"""

from __future__ import annotations

from minigpt.parallel.pipeline.engine import forward_step  # noqa: F401
from minigpt.parallel.pipeline.link import Link
from minigpt.parallel.pipeline.schedule import one_f_one_b  # noqa: F401
from minigpt.parallel.pipeline.stage import PipelineStage


def backward_step(stage: PipelineStage, i: int, link: Link, held: dict[int, tuple]) -> None:
    inputs, outputs = held.pop(i)
    if stage.is_last:
        outputs.backward()
    else:
        outputs.backward(link.recv_gradient(i))
    # the input's gradient is computed, and kept: link.send_gradient(inputs.grad, i) is missing
