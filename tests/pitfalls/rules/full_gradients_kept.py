"""Exercise 4.4: The full gradients kept."""

from __future__ import annotations

from minigpt.parallel.fsdp_by_hand.gradients import global_grad_norm, reduce_gradients as _reduce
from minigpt.parallel.fsdp_by_hand.unit import FSDPUnit as _Scaffold


def reduce_gradients(unit) -> None:
    kept = {id(p): p.full.grad for p in unit.params}
    _reduce(unit)
    for p in unit.params:
        p.full.grad = kept[id(p)]  # Mistake: the full gradient kept; the rule drops it (None) once reduced


class FSDPUnit(_Scaffold):
    reduce_scatter_gradients = staticmethod(reduce_gradients)

    global_grad_norm = staticmethod(global_grad_norm)
