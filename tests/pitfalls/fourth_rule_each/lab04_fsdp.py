"""A fourth stated rule broken at a time (see lab00_baseline.py here).

Lab 04: a shard returned as a view of the whole tensor when no padding is needed, instead of a new
tensor (4.1); a frozen parameter left out of the unit instead of owned like any other (4.2);
pre_forward writes the unit's "forward" event first, before it gathers, instead of last: the same
arithmetic, but the schedule no longer says that the forward waited for its all-gather (4.3).
"""

from __future__ import annotations

import torch
from torch import nn

from minigpt.parallel.fsdp_by_hand import ownership, sharding
from minigpt.parallel.fsdp_by_hand.ownership import Slot
from minigpt.parallel.fsdp_by_hand.sharding import gather_rows
from minigpt.parallel.fsdp_by_hand.unit import FSDPUnit as _Scaffold, _mark_inputs


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

    def pre_forward(self, module: nn.Module, args: tuple) -> tuple:
        if self.root is None:
            self._become_root()
        if self is self.root:
            self._start_step()
        if self is not self.root:
            self.event("forward")  # Mistake: written before the gather, not last
        self.unshard()
        self.wait_unshard()
        for ahead in self.forward_prefetch:
            ahead.unshard(async_op=True)
        if torch.is_grad_enabled():
            self._uses += 1
            args = _mark_inputs(self, args)
        return args
