"""Which parameters a unit owns, and every place a module uses each of them.

A unit (the module ``fully_shard`` was called on) owns the parameters of its submodules, except
those inside a nested unit (a submodule that was sharded first: it owns its own). A parameter
can be held by several modules: MiniGPT's output layer uses the token embedding's matrix
(``lm_head.weight is wte.weight``). Such a tied parameter is **one** parameter: it gets one
shard, is gathered once, and every module that holds it is pointed at the same gathered tensor,
so autograd adds the gradients of both uses into one ``.grad``. Gathering it once per holder
would send it twice and split its gradient in two.

When a tied parameter is held by modules of two different units, neither unit can gather it
for the other: :func:`check_no_parameter_in_two_units` refuses that layout, naming both places
(FSDP2 refuses it too). Put both holders in one unit, e.g. leave ``lm_head`` in the root.
"""

from __future__ import annotations

from torch import nn

Slot = tuple[nn.Module, str, str]  # (module, attribute name, qualified name for messages)


def unit_parameters(unit: nn.Module, nested: list[nn.Module]) -> list[tuple[nn.Parameter, list[Slot]]]:
    """Each distinct parameter ``unit`` owns, once, in first-seen order, with every slot
    ``(module, attribute, qualified name)`` that holds it; modules inside ``nested`` units are
    skipped (their parameters are theirs)."""
    inside_nested = {id(m) for n in nested for m in n.modules()}
    owned: dict[int, tuple[nn.Parameter, list[Slot]]] = {}
    for prefix, module in unit.named_modules(remove_duplicate=False):
        if id(module) in inside_nested:
            continue
        for attr, p in module._parameters.items():
            if p is None:
                continue
            name = f"{prefix}.{attr}" if prefix else attr
            if id(p) not in owned:
                owned[id(p)] = (p, [])
            slots = owned[id(p)][1]
            if not any(m is module and a == attr for m, a, _ in slots):
                slots.append((module, attr, name))
    return list(owned.values())


def check_no_parameter_in_two_units(
    params: list[tuple[nn.Parameter, list[Slot]]], nested_origins: dict[int, tuple[str, str]]
) -> None:
    """ValueError naming the parameter and both places when a parameter of a new unit is also
    owned by a unit below it (``nested_origins`` maps the id of each parameter a nested unit
    sharded to ``(that unit's path, the parameter's name there)``)."""
    for p, slots in params:
        if id(p) in nested_origins:
            unit, name = nested_origins[id(p)]
            raise ValueError(
                f"{slots[0][2]} is the same parameter as {unit}.{name}, which the unit {unit} already "
                f"owns: a tied parameter must live in one unit; do not make {unit} a unit of its own, "
                f"or move {slots[0][2]}'s module into it"
            )
