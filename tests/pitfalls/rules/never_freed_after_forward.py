"""Exercise 4.3: never freed after forward. Nothing to gather again before backward, so not FSDP2's order
either; the unit used twice gathered once, not three times; every block still whole when backward starts."""

from __future__ import annotations

from minigpt.parallel.fsdp_by_hand.unit import FSDPUnit as _Scaffold


class FSDPUnit(_Scaffold):
    def after_forward(self) -> None:
        pass  # Mistake: the unit is never freed after its forward
