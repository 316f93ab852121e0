"""Lab 04, one mistake: a module met twice by the walk counted twice (4.2).

``named_modules(remove_duplicate=False)`` visits a module held under two names once per name. The
tied parameter is still one entry, but each visit of the same module adds a slot, so a parameter of
a module held twice gets two slots for one place. The slot test catches it; the tied weight's test
keeps its points. Everything else is the reference's.
"""

from __future__ import annotations

from torch import nn

from minigpt.parallel.fsdp_by_hand.ownership import Slot
from minigpt.parallel.fsdp_by_hand.unit import FSDPUnit as _Scaffold


def unit_parameters(unit: nn.Module, nested: list[nn.Module]) -> list[tuple[nn.Parameter, list[Slot]]]:
    inside = {id(m) for n in nested for m in n.modules()}
    owned: dict[int, tuple[nn.Parameter, list[Slot]]] = {}
    for prefix, module in unit.named_modules(remove_duplicate=False):
        if id(module) in inside:
            continue
        for attr, p in module._parameters.items():
            if p is None:
                continue
            name = f"{prefix}.{attr}" if prefix else attr
            owned.setdefault(id(p), (p, []))[1].append((module, attr, name))  # Mistake: no check for a slot met before
    return list(owned.values())


class FSDPUnit(_Scaffold):
    unit_parameters = staticmethod(unit_parameters)
