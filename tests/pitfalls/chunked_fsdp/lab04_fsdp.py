"""Lab 04, one mistake: the rows cut with ``torch.chunk``, without padding (4.1).

``torch.chunk`` gives the last rank fewer rows when the world size does not divide them (609 rows on
2 ranks: 305 and 304), and fewer chunks than ranks when there are fewer rows than ranks (1 row on 2
ranks: one chunk, so rank 1's shard is an IndexError). The shards are no longer equal, which one
all-gather of equal pieces needs. The shard test catches it, with the error and its line; the gather
test, which gathers the reference's shards, keeps its point. Everything else is the reference's.
"""

from __future__ import annotations

import torch

from minigpt.parallel.fsdp_by_hand.sharding import gather_rows  # noqa: F401
from minigpt.parallel.fsdp_by_hand.unit import FSDPUnit as _Scaffold


def shard_rows(full: torch.Tensor, rank: int, world_size: int) -> torch.Tensor:
    return torch.chunk(full, world_size)[rank].clone()  # Mistake: unequal shards, no padding rows


class FSDPUnit(_Scaffold):
    shard_rows = staticmethod(shard_rows)
