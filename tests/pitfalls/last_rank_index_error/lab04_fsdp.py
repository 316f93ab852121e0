"""Lab 04, one mistake that crashes one rank: reduce_gradients reads one row past the end of its chunk on the
last rank only (an off-by-one that the first rank never meets). That rank stops with an IndexError in its own
code; the other waits in the reduce-scatter it started. Charged once, in the test of reduce_gradients: the
tests that run after it on the same ranks are not graded, with that error named first. Everything else is the
reference's.
"""

from __future__ import annotations

from minigpt.parallel.fsdp_by_hand.gradients import global_grad_norm, reduce_gradients as _reference  # noqa: F401
from minigpt.parallel.fsdp_by_hand.ownership import unit_parameters  # noqa: F401
from minigpt.parallel.fsdp_by_hand.prefetch import backward_prefetch_targets  # noqa: F401
from minigpt.parallel.fsdp_by_hand.sharding import gather_rows, shard_rows  # noqa: F401
from minigpt.parallel.fsdp_by_hand.unit import FSDPUnit as _Scaffold


def reduce_gradients(unit) -> None:
    if unit.rank == unit.world_size - 1:  # Mistake: the last rank's rows counted one too far
        rows = [p.rows for p in unit.params]
        rows[len(rows)]  # IndexError, on this rank only
    _reference(unit)


class FSDPUnit(_Scaffold):
    reduce_scatter_gradients = staticmethod(reduce_gradients)
