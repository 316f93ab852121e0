"""Exercise 4.3: The forward prefetch waited for, not in flight."""

from __future__ import annotations

from minigpt.parallel.fsdp_by_hand.sharding import shard_rows  # noqa: F401  (4.1's other half, right)
from minigpt.parallel.fsdp_by_hand.unit import FSDPUnit as _Scaffold


class FSDPUnit(_Scaffold):
    def before_forward(self) -> None:
        self.unshard()
        self.wait_unshard()
        for ahead in self.forward_prefetch:
            ahead.unshard()  # Mistake: synchronous: the prefetch is waited for here, not in flight
