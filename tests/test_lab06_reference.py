"""Lab 06's mechanism, checked by the course (maintainer checks, no points): a set of lists that
deadlock is refused by check_schedule before anything is sent, and, run anyway with the check
bypassed (the last scenario of tests/pipeline_worker.py, 3 ranks), ends in a PipelineTimeout that
names the stage, the micro-batch and the neighbour it waited for, instead of hanging."""

from __future__ import annotations

import pytest

from minigpt.parallel.pipeline.schedule import check_schedule, schedule_orders
from tests.pipeline_worker import reversed_warmup
from tests.ranks import scenario

pytestmark = pytest.mark.timeout(180)


def test_check_schedule_names_the_stuck_stages_of_a_reversed_warm_up():
    with pytest.raises(ValueError) as info:
        check_schedule(schedule_orders(reversed_warmup, 3, 2), 2)
    assert str(info.value) == (
        "the schedule deadlocks: stage 0 waits before B0 for B0 of stage 1; stage 1 waits before F1 for F1 of "
        "stage 0; stage 2 waits before F1 for F1 of stage 1"
    )


def test_a_deadlock_ends_in_a_timeout_that_names_who_waited_for_what(pipeline_scratch):
    """The middle stage (the shortest timeout, 2 s) waits for micro-batch 1's activations from stage
    0, which waits for micro-batch 0's gradient from it; its neighbours stop too, none hangs."""
    middle = pipeline_scratch.results[1].get("deadlock@maintainer")
    assert middle is not None, pipeline_scratch.errors[1]
    assert not middle["ok"], middle
    assert middle["error"].startswith(
        "PipelineTimeout: stage 1 (rank 1) waited 2 s for the activations of micro-batch 1 from stage 0 (rank 0)"
    ), middle["error"]
    for rank in (0, 2):
        other = pipeline_scratch.results[rank].get("deadlock@maintainer")
        assert other is not None and not other["ok"], (rank, other, pipeline_scratch.errors[rank])
        assert "PipelineTimeout" in other["error"] or "closed" in other["error"].lower(), other["error"]
    with pytest.raises(AssertionError, match="PipelineTimeout: stage 1"):
        scenario(pipeline_scratch, "deadlock@maintainer", 1)
