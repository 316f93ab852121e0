"""The calls a block of code makes to ``torch.distributed``, seen as they happen.

``with intercepted(names, note):`` replaces each function of ``names`` in the ``torch.distributed``
module by one that calls ``note(name, args, kwargs)`` and then the real function; the block's end puts
the real ones back. Code that calls ``dist.all_gather_single(...)`` through the module (FSDP2, Lab
01's ring, the tensor-parallel helpers) is seen; nothing it computes changes. A call made from inside
a noted call (``all_gather_single`` passing on to ``all_gather_into_tensor``) is noted only with
``nested=True``. Lab 03's FSDP2 counts, Lab 06's bytes per mesh dimension, the mixed-precision table
and the graded tests' rules about *how* a learner's code communicates all read their calls here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager

import torch
import torch.distributed as dist

Note = Callable[[str, tuple, dict], None]


@contextmanager
def intercepted(names: Iterable[str], note: Note, nested: bool = False) -> Iterator[None]:
    """Inside the block, every call of ``dist.<name>`` for ``name`` in ``names`` (those this torch
    has) first calls ``note(name, args, kwargs)``."""
    real = {name: getattr(dist, name) for name in names if hasattr(dist, name)}
    depth = 0

    def seen(name: str, function: Callable) -> Callable:
        def call(*args, **kwargs):
            nonlocal depth
            if nested or depth == 0:
                note(name, args, kwargs)
            depth += 1
            try:
                return function(*args, **kwargs)
            finally:
                depth -= 1

        return call

    for name, function in real.items():
        setattr(dist, name, seen(name, function))
    try:
        yield
    finally:
        for name, function in real.items():
            setattr(dist, name, function)


def tensors(args: tuple, kwargs: dict) -> list[torch.Tensor]:
    """The tensors passed to a call, by position then by name."""
    return [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]


def largest_bytes(args: tuple, kwargs: dict) -> int:
    """The bytes of a call's largest tensor: an all-gather's output, a reduce-scatter's input."""
    return max((t.numel() * t.element_size() for t in tensors(args, kwargs)), default=0)


def group_of(args: tuple, kwargs: dict) -> dist.ProcessGroup | None:
    """The process group a call runs on (None: the default group)."""
    group = kwargs.get("group")
    return group if group is not None else next((a for a in args if isinstance(a, dist.ProcessGroup)), None)
