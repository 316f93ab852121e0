"""How a learner's code computes, seen from the workers' scenarios: the rules a stub states about the
*how* (one all-gather, one copy per bucket, no communication in backward) need more than the result.

* :func:`collectives` notes every call of a ``torch.distributed`` collective or point-to-point
  operation made inside a ``with`` block (Lab 01's ring and the tensor-parallel helpers go through
  ``dist.isend``/``dist.irecv``, so they are seen too);
* :class:`BufferWrites` counts the operations that write into one buffer something read from
  outside it: the copies into a bucket, not the bucket divided in place.

Both watch for the duration of the block only (:func:`minigpt.parallel.calls.intercepted`, a
dispatch mode), and change no result.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from minigpt.parallel import calls

COLLECTIVES = (
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_object",
    "all_gather_single",
    "all_reduce",
    "all_to_all",
    "all_to_all_single",
    "barrier",
    "batch_isend_irecv",
    "broadcast",
    "gather",
    "irecv",
    "isend",
    "recv",
    "reduce",
    "reduce_scatter",
    "reduce_scatter_single",
    "reduce_scatter_tensor",
    "scatter",
    "send",
)


@contextmanager
def collectives() -> Iterator[list[tuple[str, list[int]]]]:
    """Every ``torch.distributed`` communication called inside the block (as ``dist.<name>``), in
    order: ``(name, [elements of each tensor passed by position])``."""
    seen: list[tuple[str, list[int]]] = []

    def note(name: str, args: tuple, kwargs: dict) -> None:
        seen.append((name, [a.numel() for a in args if isinstance(a, torch.Tensor)]))

    with calls.intercepted(COLLECTIVES, note, nested=True):
        yield seen


class BufferWrites(TorchDispatchMode):
    """Inside ``with BufferWrites(buffer) as writes:``, ``writes.count`` is the number of operations
    that wrote into ``buffer``'s storage while reading a tensor from elsewhere (a copy in, one per
    call: ``torch._foreach_copy_`` over every slot counts 1, a loop of ``copy_`` one per slot); an
    operation on the buffer alone (``buffer.div_(n)``, ``zero_()``), a scalar operand and the
    collectives (``c10d``) do not count."""

    def __init__(self, buffer: torch.Tensor):
        super().__init__()
        self.storage = buffer.untyped_storage().data_ptr()
        self.count = 0

    def _ours(self, t: torch.Tensor) -> bool:
        return t.untyped_storage().data_ptr() == self.storage

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if func.namespace != "c10d":
            written = []
            for i, argument in enumerate(func._schema.arguments):
                if argument.alias_info is not None and argument.alias_info.is_write:
                    value = args[i] if i < len(args) else kwargs.get(argument.name)
                    written += [t for t in tree_flatten(value)[0] if isinstance(t, torch.Tensor)]
            read = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor) and t.dim() > 0]
            if any(self._ours(t) for t in written) and any(not self._ours(t) for t in read):
                self.count += 1
        return out
