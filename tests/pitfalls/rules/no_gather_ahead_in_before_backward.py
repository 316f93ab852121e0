"""Exercise 4.3: No all-gather ahead in before_backward."""

from __future__ import annotations

from minigpt.parallel.fsdp_by_hand.unit import FSDPUnit as _Scaffold


class FSDPUnit(_Scaffold):
    def before_backward(self) -> None:
        self.unshard()
        self.wait_unshard()  # Mistake: no all-gather ahead for the units whose backward comes next
