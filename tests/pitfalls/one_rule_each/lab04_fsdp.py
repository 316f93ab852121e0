"""One stated rule broken at a time (see lab00_baseline.py here).

Lab 04: gather_rows returns the padding rows too (4.1); unit_parameters does not skip the modules of
nested units (4.2); reduce_gradients leaves each full gradient in place after reducing it, instead of
dropping it (4.4); after_forward never frees a block, whatever reshard_after_forward says (4.3).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from minigpt.parallel.fsdp_by_hand.gradients import global_grad_norm, reduce_gradients as _reduce
from minigpt.parallel.fsdp_by_hand.ownership import Slot
from minigpt.parallel.fsdp_by_hand.sharding import shard_rows  # noqa: F401
from minigpt.parallel.fsdp_by_hand.unit import FSDPUnit as _Scaffold


def gather_rows(shard: torch.Tensor, rows: int, group: dist.ProcessGroup | None = None) -> torch.Tensor:
    world = dist.get_world_size(group)
    out = shard.new_empty((world * shard.shape[0], *shard.shape[1:]))
    dist.all_gather_single(out, shard.contiguous(), group=group)
    return out  # Mistake: the padding rows kept (out[:rows] is the tensor)


def unit_parameters(unit: nn.Module, nested: list[nn.Module]) -> list[tuple[nn.Parameter, list[Slot]]]:
    owned: dict[int, tuple[nn.Parameter, list[Slot]]] = {}
    for prefix, module in unit.named_modules(remove_duplicate=False):  # Mistake: nested units not skipped
        for attr, p in module._parameters.items():
            if p is None:
                continue
            slots = owned.setdefault(id(p), (p, []))[1]
            if not any(m is module and a == attr for m, a, _ in slots):
                slots.append((module, attr, f"{prefix}.{attr}" if prefix else attr))
    return list(owned.values())


def reduce_gradients(unit) -> None:
    kept = {id(p): p.full.grad for p in unit.params}
    _reduce(unit)
    for p in unit.params:
        p.full.grad = kept[id(p)]  # Mistake: the full gradient kept; the rule drops it (None) once reduced


class FSDPUnit(_Scaffold):
    gather_rows = staticmethod(gather_rows)
    unit_parameters = staticmethod(unit_parameters)
    reduce_scatter_gradients = staticmethod(reduce_gradients)
    global_grad_norm = staticmethod(global_grad_norm)

    def after_forward(self) -> None:
        pass  # Mistake: the unit is never freed after its forward
