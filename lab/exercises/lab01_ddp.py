"""Lab 01 exercises: DDP from scratch.

Fill in the four pieces, then grade yourself:

    make grade LAB=01          # this lab: points per exercise, one line per lost point
    make grade EX=1.1          # one exercise (the reference stands in for the others)
    make grade LAB=01 LANG=es  # el informe en español
    torchrun --nproc_per_node=2 lab/01_ddp.py --check --impl exercises   # train with yours

Read the lab guide first: ``lab/01-ddp-from-scratch.md``. The reference is in
``minigpt/parallel/ring.py`` and ``minigpt/parallel/ddp.py``; try not to peek.

Your :class:`BucketedDDP` inherits the scaffolding from the reference (broadcast at start,
``forward``, ``no_sync``, the bucket buffers, introspection) and replaces the four methods that
make it data parallel. What you can use:

* ``chunk_bounds(length, parts)`` -> the ``(start, stop)`` of each of ``parts`` chunks;
* ``ring_position(group)`` -> ``.world_size``, ``.rank``, ``.right``, ``.left`` of this rank;
* ``exchange(position, outgoing, incoming, counter)`` sends ``outgoing`` to the right neighbour
  while receiving ``incoming`` from the left one, and counts the bytes (the tests read them);
* a :class:`Bucket` has ``.index``, ``.params``, ``.names``, ``.slices`` (where each parameter
  sits in the buffer), ``.buffer``, ``.views`` (each parameter's slot: a view of the buffer
  shaped like it, in the order of ``.params``), ``.ready`` (a set of ``id(param)``),
  ``.is_full()``, ``.handle`` and timing fields; ``self.buckets``, ``self._bucket_of[id(param)]``
  (the *index* of the parameter's bucket), ``self._slot(param)`` (its slot),
  ``self.world_size``, ``self.process_group``, ``self.collective`` ("torch" or "ring"),
  ``self._next_bucket``, ``self._now()`` come from the scaffolding.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from minigpt.parallel.ddp import Bucket, BucketedDDP as _Scaffold, _Pending  # noqa: F401
from minigpt.parallel.ring import COUNTER, ByteCounter, chunk_bounds, exchange, ring_position  # noqa: F401


def ring_all_reduce(
    tensor: torch.Tensor, op: str = "sum", group: dist.ProcessGroup | None = None, counter: ByteCounter | None = None
) -> torch.Tensor:
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
    * walk the parameters in *reverse* registration order, adding each to the current bucket;
      close the bucket as soon as its size (the sum of ``numel() * element_size()``) *reaches*
      ``bucket_cap_bytes``, as PyTorch's DDP does: a bucket may pass the cap by its last
      parameter, and a small tensor (a bias) travels with the larger one after it instead of in
      a message of its own;
    * a bucket holds one dtype on one device: a parameter of another dtype or device closes the
      current bucket and starts the next.
    """
    raise NotImplementedError(
        "Exercise 1.2: buckets in reverse order, closed when they reach the cap; skip frozen, tied once"
    )


class BucketedDDP(_Scaffold):
    assign_buckets = staticmethod(assign_buckets)

    def _on_grad_ready(self, param: nn.Parameter) -> None:
        """Exercise 1.3a: the hook, called with the *parameter* (its ``.grad`` is ready).

        Do nothing when ``self._sync_this_backward`` is False (``no_sync``). On the first call of
        a backward pass: set ``self._backward_started``, reset ``self._next_bucket`` and every
        bucket (``bucket.reset()``), and queue ``self.finish_gradient_synchronization`` with
        ``torch.autograd.Variable._execution_engine.queue_callback``.

        Then only keep count (the hook runs once per parameter, and every Python call costs
        microseconds): mark the parameter ready in its bucket
        (``self.buckets[self._bucket_of[id(param)]]``: add ``id(param)`` to ``bucket.ready``; set
        ``bucket.first_ready_s`` the first time and ``bucket.last_ready_s`` when it is full, from
        ``self._now()``: the timeline test reads them), and launch (``self._launch``) every
        complete bucket *in index order*: bucket k may go only after buckets 0..k-1, so that every
        rank launches the same bucket first.
        """
        raise NotImplementedError(
            "Exercise 1.3: the hook marks the parameter ready and launches complete buckets in index order"
        )

    def _launch(self, bucket: Bucket) -> None:
        """Exercise 1.3b: fill the bucket and start its asynchronous all-reduce.

        Set ``bucket.launched_s = self._now()``. Move the bucket's gradients into its buffer in
        one call, ``torch._foreach_copy_(bucket.views, [p.grad for p in bucket.params])``, and
        divide the buffer by ``self.world_size`` in place. Then start the sum over the ranks
        without waiting for it: ``dist.all_reduce(bucket.buffer, group=self.process_group,
        async_op=True)`` (keep the returned work in ``bucket.handle`` as ``_Pending(work=...)``),
        or, when ``self.collective == "ring"``, your ``ring_all_reduce`` submitted to
        ``self._ring_thread`` (a ``ThreadPoolExecutor``: ``_Pending(future=...)``; count the bytes
        into ``self.ring_bytes``, a ``ByteCounter``).
        """
        raise NotImplementedError("Exercise 1.3: copy the bucket's gradients in, divide, start an async all-reduce")

    def finish_gradient_synchronization(self) -> None:
        """Exercise 1.4: wait for the buckets; the averages become the gradients.

        Return at once if no backward is in progress (``self._backward_started``); then clear
        it, so a second call is harmless. If some buckets were never launched, raise
        RuntimeError naming the parameters that got no gradient (waiting for them would hang).
        Otherwise wait for every bucket's handle and make each of its parameters' ``.grad`` its
        slot (``p.grad = self._slot(p)``, or the bucket's ``.views``: a view of the buffer, where the average is; no copy
        back), set ``self.bytes_all_reduced`` to the bytes of all buffers and add one to
        ``self.steps_synchronised``.
        """
        raise NotImplementedError("Exercise 1.4: wait for every bucket, make each .grad a view of its slot")
