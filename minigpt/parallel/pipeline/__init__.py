"""Pipeline parallelism written by hand (Lab 06), one concept a file.

* :mod:`.schedule` - GPipe and 1F1B as explicit lists of operations per stage, checked for
  deadlocks before anything runs, and drawn as a chart;
* :mod:`.stage` - MiniGPT cut into consecutive stages, the tied embedding matrix copied to the
  first and the last;
* :mod:`.link` - the sends and receives between neighbouring stages, tagged by micro-batch, with a
  timeout that names who waited for what;
* :mod:`.engine` - one training step: the schedule run operation by operation, the tied gradient
  swapped, the whole model's norm, the bytes formula, the bubble measured.
"""

from minigpt.parallel.pipeline.engine import (
    MicroBatches,
    StepRecord,
    backward_step,
    bubble_fraction,
    clip_grad_norm_,
    forward_only,
    forward_step,
    run_schedule,
    step_bytes_model,
    sync_tied_gradient,
)
from minigpt.parallel.pipeline.link import Link, PipelineTimeout
from minigpt.parallel.pipeline.schedule import (
    SCHEDULES,
    chart,
    check_posting_order,
    check_schedule,
    gpipe,
    one_f_one_b,
    peak_held,
    schedule_orders,
)
from minigpt.parallel.pipeline.stage import PipelineStage, stage_blocks

__all__ = [
    "SCHEDULES",
    "Link",
    "MicroBatches",
    "PipelineStage",
    "PipelineTimeout",
    "StepRecord",
    "backward_step",
    "bubble_fraction",
    "chart",
    "check_posting_order",
    "check_schedule",
    "clip_grad_norm_",
    "forward_only",
    "forward_step",
    "gpipe",
    "one_f_one_b",
    "peak_held",
    "run_schedule",
    "schedule_orders",
    "stage_blocks",
    "step_bytes_model",
    "sync_tied_gradient",
]
