"""The pieces of Lab 05 a learner writes, gathered in one object the layers and ring attention use.

Each field is one function of the lab's exercises. :func:`reference_kit` holds the reference
(``minigpt/``); :func:`kit_for` ``("exercises")`` the learner's (``lab/exercises/lab05_tensor_parallel.py``,
through :func:`minigpt.impl.load`, so that ``MINIGPT_EXERCISE`` keeps every other exercise the
reference's). A model or a ring built with a kit calls only the kit's versions of these pieces:

* ``column_slice``, ``row_slice``, ``row_parallel_linear`` (Exercise 5.1): how a ``Linear`` is cut
  by output or input features, and where the row-parallel layer's bias goes;
* ``copy_to_tp``, ``reduce_from_tp`` (Exercise 5.2): Megatron's conjugate operators f and g;
* ``vocab_parallel_cross_entropy`` (Exercise 5.3): the loss from each rank's vocabulary slice;
* ``online_softmax_step``, ``block_mask`` (Exercise 5.4): ring attention's merge of one key/value
  block into the running softmax, and which keys of a block pair a query may see.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from functools import cache

from minigpt import impl
from minigpt.parallel.tensor_parallel import comm, layers
from minigpt.parallel.tensor_parallel.ring_attention import block_mask, online_softmax_step

EXERCISE_MODULE = "lab05_tensor_parallel"


@dataclass(frozen=True)
class Kit:
    column_slice: Callable
    row_slice: Callable
    row_parallel_linear: Callable
    copy_to_tp: Callable
    reduce_from_tp: Callable
    vocab_parallel_cross_entropy: Callable
    online_softmax_step: Callable
    block_mask: Callable


@cache
def reference_kit() -> Kit:
    """Every piece from ``minigpt/``."""
    return Kit(
        column_slice=layers.column_slice,
        row_slice=layers.row_slice,
        row_parallel_linear=layers.row_parallel_linear,
        copy_to_tp=comm.copy_to_tp,
        reduce_from_tp=comm.reduce_from_tp,
        vocab_parallel_cross_entropy=layers.vocab_parallel_cross_entropy,
        online_softmax_step=online_softmax_step,
        block_mask=block_mask,
    )


def kit_for(implementation: str | None = None) -> Kit:
    """The kit of ``implementation`` (``"reference"`` or ``"exercises"``; default ``MINIGPT_IMPL``)."""
    chosen = impl.current() if implementation is None else implementation
    if chosen == "reference":
        return reference_kit()
    return Kit(**{f.name: impl.load(EXERCISE_MODULE, f.name, chosen) for f in fields(Kit)})
