"""FSDP written by hand: ZeRO-3 in PyTorch, one concept a file (Lab 04).

The design is FSDP2's (``torch.distributed.fsdp.fully_shard``), read in Lab 03: every parameter
is sharded on its own along its rows, the module keeps its shard as its parameter, and hooks
gather a unit's parameters just before they are needed and free them right after.

* :mod:`.sharding` - one parameter cut into equal, padded shards and gathered back;
* :mod:`.ownership` - which parameters a unit owns; tied parameters counted once;
* :mod:`.unit` - a unit's state, ZeRO-3's four moves, and the hooks that keep the books;
* :mod:`.gradients` - the reduce-scatter of a unit's gradients; clipping by the global norm;
* :mod:`.prefetch` - which unit to gather ahead in backward;
* :mod:`.api` - ``fully_shard`` and the explicit prefetch lists;
* :mod:`.state` - full and sharded state dicts, loadable at another world size;
* :mod:`.record` - what a step did: schedule, bytes, memory held.
"""

from minigpt.parallel.fsdp_by_hand.api import (
    find_units,
    fully_shard,
    set_modules_to_backward_prefetch,
    set_modules_to_forward_prefetch,
    unit_of,
)
from minigpt.parallel.fsdp_by_hand.gradients import clip_grad_norm_
from minigpt.parallel.fsdp_by_hand.record import Recorder
from minigpt.parallel.fsdp_by_hand.state import (
    full_gradients,
    full_optimizer_state_dict,
    full_state_dict,
    load_full_state_dict,
    load_sharded,
    save_sharded,
    whole_training_state,
)
from minigpt.parallel.fsdp_by_hand.unit import MixedPrecision

__all__ = [
    "MixedPrecision",
    "Recorder",
    "clip_grad_norm_",
    "find_units",
    "full_gradients",
    "full_optimizer_state_dict",
    "full_state_dict",
    "fully_shard",
    "load_full_state_dict",
    "whole_training_state",
    "load_sharded",
    "save_sharded",
    "set_modules_to_backward_prefetch",
    "set_modules_to_forward_prefetch",
    "unit_of",
]
