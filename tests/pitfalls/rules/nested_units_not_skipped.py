"""Exercise 4.2: Nested units not skipped."""

from __future__ import annotations

from torch import nn

from minigpt.parallel.fsdp_by_hand.ownership import Slot
from minigpt.parallel.fsdp_by_hand.unit import FSDPUnit as _Scaffold


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


class FSDPUnit(_Scaffold):
    unit_parameters = staticmethod(unit_parameters)
