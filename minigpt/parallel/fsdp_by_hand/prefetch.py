"""Which units to all-gather ahead of time, so that communication hides behind computation.

While unit U computes, the all-gather of the unit that runs next can already travel. Our FSDP
issues such a *prefetch* as an asynchronous all-gather at U's pre-forward (forward prefetch) or
U's pre-backward (backward prefetch); the next unit's own hook then only waits for it.

The order comes from the forward itself (*implicit* prefetch, FSDP2's default in backward):
the root writes down the order in which units finish their forward (their post-forward).
Backward runs the units in the reverse of that order: the root first (its output is the loss),
then the last block, ..., the first block. So at a unit's pre-backward, the units to prefetch
are the ones that follow it in that reversed list. Nothing is prefetched in forward by default:
the first forward has no order yet, and FSDP2 asks for an explicit list there.

*Explicit* prefetch (``set_modules_to_forward_prefetch`` / ``set_modules_to_backward_prefetch``
on the unit, as in FSDP2) replaces the rule with a list the user chose, e.g. two units ahead.

The mistake to avoid: at a unit's pre-backward, the unit whose backward *just finished* is the
one before it in the reversed list, and it is done with its parameters. Prefetching it (reading
FSDP1's BACKWARD_POST, "after the current unit's backward", as a place in the list) gathers a
unit nobody needs any more and leaves the next one to be gathered late.
"""

from __future__ import annotations


def backward_prefetch_targets(post_forward_order: list[str], current: str, depth: int = 1) -> list[str]:
    """The ``depth`` units whose backward comes right after ``current``'s, given the order in which
    units finished their forward (a unit that ran twice counts at its last finish). Empty when
    ``current`` is the last to run backward or is not in the order."""
    last_finish: dict[str, int] = {name: i for i, name in enumerate(post_forward_order)}
    backward_order = sorted(last_finish, key=last_finish.__getitem__, reverse=True)
    if current not in backward_order or depth < 1:
        return []
    i = backward_order.index(current)
    return backward_order[i + 1 : i + 1 + depth]
