"""Lab 04, one mistake: the global norm from one number per rank (4.4).

Each rank squares the norm of all its pieces together and one all-reduce of that single number sums
the ranks. Equal on paper; but a parameter's pieces are no longer summed over the ranks before the
norms of the parameters are combined, so the sum runs in another order and the norm is no longer
FSDP2's to the bit. The norm test catches it by the all-reduce it calls, and the test of FSDP2's bits
by its bits (with the same cause). Everything else is the reference's.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from minigpt.parallel.fsdp_by_hand.api import find_units
from minigpt.parallel.fsdp_by_hand.gradients import local_norms
from minigpt.parallel.fsdp_by_hand.unit import FSDPUnit as _Scaffold


@torch.no_grad()
def global_grad_norm(model: nn.Module) -> torch.Tensor:
    norms = local_norms(model)
    if not norms:
        return torch.zeros(())
    squares = torch.linalg.vector_norm(torch.stack(norms)).pow(2)  # Mistake: one number per rank
    dist.all_reduce(squares, op=dist.ReduceOp.SUM, group=find_units(model)[0].group)
    return squares.pow(0.5)


class FSDPUnit(_Scaffold):
    global_grad_norm = staticmethod(global_grad_norm)
