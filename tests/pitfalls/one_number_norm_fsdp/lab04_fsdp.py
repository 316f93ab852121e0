"""Lab 04, one mistake: the global norm from one number per rank (4.4).

Each rank squares the norm of all its pieces together and one all-reduce of that single number sums
the ranks. Equal on paper; but a parameter's pieces are no longer summed over the ranks before the
norms of the parameters are combined, so the sum runs in another order and the norm is no longer
FSDP2's to the bit. The norm test catches it by the all-reduce it calls. Everything else is the
reference's.
"""

from __future__ import annotations

from minigpt.parallel.fsdp_by_hand.gradients import global_grad_norm_one_number, reduce_gradients  # noqa: F401
from minigpt.parallel.fsdp_by_hand.unit import FSDPUnit as _Scaffold

global_grad_norm = global_grad_norm_one_number  # Mistake: one all-reduce of one number per rank


class FSDPUnit(_Scaffold):
    global_grad_norm = staticmethod(global_grad_norm)
