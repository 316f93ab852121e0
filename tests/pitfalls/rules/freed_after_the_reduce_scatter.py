"""Exercise 4.3: Reduce-scattered, then freed."""

from __future__ import annotations

from minigpt.parallel.fsdp_by_hand.unit import FSDPUnit as _Scaffold


class FSDPUnit(_Scaffold):
    def after_backward(self) -> None:
        self.reduce_gradients()
        self.reshard()  # Mistake: freed after the reduce-scatter, not before
