"""Lab 07, one mistake: the CP coordinate taken as ``rank % cp`` - 7.2.

Right when tp is 1 (the cp coordinate is then the rank's last digit). With tp 2, ranks 0 and 1 are
one TP group and share their cp coordinate, but ``rank % cp`` gives them different pairs of chunks:
the two halves of a TP group compute on different tokens. Everything else is the reference's.
"""

from __future__ import annotations

from minigpt.parallel.mesh.compose import whole_parameter  # noqa: F401
from minigpt.parallel.mesh.nd import (
    batch_plan as _plan,
    mesh_groups,  # noqa: F401
)


def batch_plan(degrees, rank, batch_size, seq_len):
    rows, _ = _plan(degrees, rank, batch_size, seq_len)  # the rows and the refusals are the reference's
    cp = degrees["cp"]
    c = rank % cp  # not the cp coordinate: tp varies faster than cp
    return rows, (c, 2 * cp - 1 - c)
