"""Lab 01 exercises: DDP from scratch.

Fill in the four pieces, then grade yourself:

    make grade                                                       # every lab
    .venv/bin/python -m pytest tests/test_lab01.py --impl=exercises  # this lab only
    torchrun --nproc_per_node=2 lab/01_ddp.py --check --impl exercises   # train with yours

Read the lab guide first: ``lab/01-ddp-from-scratch.md``. The reference is in
``minigpt/dist/ring.py`` and ``minigpt/dist/ddp.py``; try not to peek.

Your :class:`BucketedDDP` inherits the scaffolding from the reference (broadcast at start,
``forward``, ``no_sync``, the bucket buffers, introspection) and replaces the four methods that
make it data parallel. What you can use:

* ``chunk_bounds(length, parts)`` -> the ``(start, stop)`` of each of ``parts`` chunks;
* ``ring_position(group)`` -> ``.world_size``, ``.rank``, ``.right``, ``.left`` of this rank;
* ``exchange(position, outgoing, incoming, counter)`` sends ``outgoing`` to the right neighbour
  while receiving ``incoming`` from the left one, and counts the bytes (the tests read them);
* a :class:`Bucket` has ``.index``, ``.params``, ``.names``, ``.slices`` (where each parameter
  sits in the buffer), ``.buffer``, ``.ready`` (a set of ``id(param)``), ``.is_full()``,
  ``.handle`` and timing fields; ``self.buckets``, ``self._bucket_of[id(param)]``,
  ``self.world_size``, ``self.process_group``, ``self.collective`` ("torch" or "ring"),
  ``self._next_bucket``, ``self._now()`` come from the scaffolding.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from minigpt.dist.ddp import Bucket, BucketedDDP as _Scaffold, _Pending  # noqa: F401
from minigpt.dist.ring import COUNTER, ByteCounter, chunk_bounds, exchange, ring_position  # noqa: F401


def ring_all_reduce(tensor: torch.Tensor, op: str = "sum", group: dist.ProcessGroup | None = None,
                    counter: ByteCounter | None = None) -> torch.Tensor:
    """Exercise 1.1: the ring all-reduce, in place.

    ``tensor`` is contiguous; work on ``tensor.view(-1)``. Cut it into ``world_size`` chunks with
    ``chunk_bounds`` (lengths need not divide evenly). Then

    1. reduce-scatter, ``world_size - 1`` steps: at step s, send chunk (rank - s - 1) and
       receive chunk (rank - s - 2) (mod world_size) into a fresh tensor, and add it into place;
       afterwards chunk ``rank`` holds the full sum;
    2. for ``op == "avg"`` divide your finished chunk by the world size;
    3. all-gather, ``world_size - 1`` steps: send chunk (rank - s), receive chunk
       (rank - s - 1) straight into place.

    Move data only through ``exchange(position, outgoing, incoming, counter or COUNTER)``: pass
    chunks, never the whole tensor (the tests count the bytes: 2(N-1)/N of the tensor). Reject
    an unknown ``op`` with ValueError. Return ``tensor``.
    """
    raise NotImplementedError("Exercise 1.1: ring all-reduce = reduce-scatter then all-gather, chunk by chunk")


def assign_buckets(module: nn.Module, bucket_cap_bytes: int) -> list[list[tuple[str, nn.Parameter]]]:
    """Exercise 1.2: group the trainable parameters into buckets.

    Return a list of buckets, each a list of ``(name, parameter)``:

    * leave out parameters with ``requires_grad=False``;
    * a parameter shared by two modules (tied weights) appears once; name it by all its names
      joined with " = " in registration order (``module.named_parameters(remove_duplicate=False)``
      lists every name);
    * walk the parameters in *reverse* registration order; start a new bucket when adding the
      next parameter would take the current bucket past ``bucket_cap_bytes``
      (size = ``numel() * element_size()``); a parameter larger than the cap gets its own bucket.
    """
    raise NotImplementedError("Exercise 1.2: buckets in reverse order up to the cap; skip frozen, tied once")


class BucketedDDP(_Scaffold):
    assign_buckets = staticmethod(assign_buckets)

    def _on_grad_ready(self, param: nn.Parameter) -> None:
        """Exercise 1.3a: the hook, called with the *parameter* (its ``.grad`` is ready).

        Do nothing when ``self._sync_this_backward`` is False (``no_sync``). On the first call of
        a backward pass: set ``self._backward_started``, reset ``self._next_bucket`` and every
        bucket (``bucket.reset()``), and queue ``self.finish_gradient_synchronization`` with
        ``torch.autograd.Variable._execution_engine.queue_callback``. Then mark the parameter
        ready in its bucket and launch (``self._launch``) every complete bucket *in index order*:
        bucket k may go only after buckets 0..k-1, so that every rank launches the same bucket
        first.
        """
        raise NotImplementedError("Exercise 1.3: the hook marks the parameter ready and launches complete buckets in index order")

    def _launch(self, bucket: Bucket) -> None:
        """Exercise 1.3b: the asynchronous launch.

        Copy each parameter's ``.grad`` into its slice of ``bucket.buffer``, divide the buffer by
        the world size, set ``bucket.launched_s = self._now()``, and start the sum over the ranks
        without waiting for it: ``dist.all_reduce(..., async_op=True)`` (keep the returned work in
        ``bucket.handle`` as ``_Pending(work=...)``), or, when ``self.collective == "ring"``, your
        ``ring_all_reduce`` submitted to ``self._ring_thread`` (``_Pending(future=...)``; count
        into ``self.ring_bytes``).
        """
        raise NotImplementedError("Exercise 1.3: flatten the bucket, divide by the world size, start an async all-reduce")

    def finish_gradient_synchronization(self) -> None:
        """Exercise 1.4: wait for the buckets and unflatten.

        Return at once if no backward is in progress (``self._backward_started``); then clear
        it, so a second call is harmless. If some buckets were never launched, raise
        RuntimeError naming the parameters that got no gradient (waiting for them would hang).
        Otherwise wait for every bucket's handle, copy each slice of the buffer back into its
        parameter's ``.grad``, set ``self.bytes_all_reduced`` to the bytes of all buffers and
        add one to ``self.steps_synchronised``.
        """
        raise NotImplementedError("Exercise 1.4: wait for every bucket, copy the averages back into .grad")
