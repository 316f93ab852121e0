"""How a module is marked as a unit (and a parameter as kept whole), and how a model's units are found: the
marks every other module of the package reads, so that none of them imports another to find a unit."""

from __future__ import annotations

from torch import nn

UNIT_ATTR = "_fsdp_by_hand_unit"  # the attribute that marks a module as a unit
WHOLE_ATTR = "_fsdp_by_hand_whole"  # ... and an ignored parameter, with the unit that keeps it whole


def find_units(root: nn.Module) -> list:
    """The root's unit, then every unit below it in module order, each named by its path ("root", "blocks.0")."""
    units = []
    for name, module in root.named_modules():
        if (unit := getattr(module, UNIT_ATTR, None)) is not None:
            unit.name = name or "root"
            units.append(unit)
    return units
