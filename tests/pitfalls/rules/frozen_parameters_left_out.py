"""Exercise 4.2."""

from __future__ import annotations

from torch import nn

from minigpt.parallel.fsdp_by_hand import ownership
from minigpt.parallel.fsdp_by_hand.ownership import Slot
from minigpt.parallel.fsdp_by_hand.unit import FSDPUnit as _Scaffold


def unit_parameters(unit: nn.Module, nested: list[nn.Module]) -> list[tuple[nn.Parameter, list[Slot]]]:
    owned = ownership.unit_parameters(unit, nested)
    return [(p, slots) for p, slots in owned if p.requires_grad]  # Mistake: frozen parameters left out


class FSDPUnit(_Scaffold):
    unit_parameters = staticmethod(unit_parameters)
