"""Lab 04, one mistake: a unit never freed after its backward (4.3).

after_backward reduce-scatters the unit's gradients and stops there: the gathered parameters stay
until the end-of-backward callback frees every unit at once. The gradients, the bytes, the order and
the memory after the step are all right; only backward's peak shows it, block after block kept whole
(the backward peak test, which names the unit still held when the next one's backward started).
Everything else is the reference's.
"""

from __future__ import annotations

from minigpt.parallel.fsdp_by_hand.unit import FSDPUnit as _Scaffold


class FSDPUnit(_Scaffold):
    def after_backward(self) -> None:
        self.reduce_gradients()  # Mistake: never freed here: the unit stays whole to the end of backward
