"""A fourth stated rule broken at a time (see lab00_baseline.py here).

Lab 04: a shard returned as a view of the whole tensor when no padding is needed, instead of a new
tensor (4.1); a frozen parameter left out of the unit instead of owned like any other (4.2);
after_backward reduce-scatters first and frees the unit after, instead of freeing it first: the same
gradients and bytes, but the reduce-scatter's buffer joins the gathered parameters instead of taking
their place, and backward's peak is one unit's parameters higher (4.3).
"""

from __future__ import annotations

from torch import nn

from minigpt.parallel.fsdp_by_hand import ownership, sharding
from minigpt.parallel.fsdp_by_hand.ownership import Slot
from minigpt.parallel.fsdp_by_hand.sharding import gather_rows
from minigpt.parallel.fsdp_by_hand.unit import FSDPUnit as _Scaffold


def shard_rows(full, rank: int, world_size: int):
    rows = full.shape[0]
    if rows % world_size == 0:
        per_rank = rows // world_size
        return full[rank * per_rank : (rank + 1) * per_rank]  # Mistake: a view of full, not a new tensor
    return sharding.shard_rows(full, rank, world_size)


def unit_parameters(unit: nn.Module, nested: list[nn.Module]) -> list[tuple[nn.Parameter, list[Slot]]]:
    owned = ownership.unit_parameters(unit, nested)
    return [(p, slots) for p, slots in owned if p.requires_grad]  # Mistake: frozen parameters left out


class FSDPUnit(_Scaffold):
    shard_rows = staticmethod(shard_rows)
    gather_rows = staticmethod(gather_rows)
    unit_parameters = staticmethod(unit_parameters)

    def after_backward(self) -> None:
        self.reduce_gradients()
        self.reshard()  # Mistake: freed after the reduce-scatter, not before
