"""Lab 01 exercises: DDP from scratch.

Fill in the four pieces, then grade yourself:

    make grade LAB=01          # this lab: points per exercise, one line per lost point
    make grade EX=1.1          # one exercise (the reference stands in for the others)
    make grade LAB=01 LANG=es  # el informe en español
    make hint EX=1.1           # stuck? the next hint of one exercise (one more on each call)
    torchrun --nproc_per_node=2 lab/01_ddp.py --check --impl exercises   # train with yours

Read the lab guide first: ``lab/01-ddp-from-scratch.md``. Each stub states its task: what it must
achieve, its contract, and why it matters; the steps are in the hints. The reference is in
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

    What: when it returns, ``tensor`` holds on every rank of ``group`` the element-wise sum of
    every rank's ``tensor`` (``op="sum"``) or their mean (``op="avg"``), the same bits on every rank,
    and it is the tensor returned (reduced in place, not a copy).

    Contract: ``tensor`` is contiguous, of any length: cut its flat view into ``world_size`` chunks
    with ``chunk_bounds`` (lengths need not divide evenly). Data moves only through
    ``exchange(position, outgoing, incoming, counter or COUNTER)``, ``position`` being
    ``ring_position(group)``: it sends ``outgoing`` to the right neighbour while it receives
    ``incoming`` from the left one, and counts the bytes. Pass chunks, never the whole tensor: each
    rank sends 2(N-1)/N of the tensor in all (the tests count it). Any other ``op`` is a ValueError.

    Why: it is the algorithm under every data-parallel all-reduce. A reduce-scatter round the ring
    leaves each rank one finished chunk of the sum; an all-gather round the ring hands every
    finished chunk to every rank. The bytes a rank sends hardly grow with the number of ranks, and
    since each chunk is summed once, by one rank, every rank ends with the same bits.
    """
    raise NotImplementedError("Exercise 1.1: ring all-reduce = reduce-scatter then all-gather, chunk by chunk")


def assign_buckets(module: nn.Module, bucket_cap_bytes: int) -> list[list[tuple[str, nn.Parameter]]]:
    """Exercise 1.2: group the trainable parameters into buckets.

    Return a list of buckets, each a list of ``(name, parameter)``, with these rules:

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

    Why: one all-reduce per parameter pays a fixed latency per message; one for everything waits for
    the end of backward. Backward produces gradients roughly in reverse registration order, so the
    first bucket fills early and its all-reduce travels while backward goes on. A frozen parameter
    never gets a gradient (a bucket waiting for it would wait forever), and a tied one has one
    ``.grad`` whose hook fires once.
    """
    raise NotImplementedError(
        "Exercise 1.2: buckets in reverse order, closed when they reach the cap; skip frozen, tied once"
    )


class BucketedDDP(_Scaffold):
    assign_buckets = staticmethod(assign_buckets)

    def _on_grad_ready(self, param: nn.Parameter) -> None:
        """Exercise 1.3a: the hook, called with the *parameter* once its ``.grad`` is final for this
        backward (the argument is the parameter, not the gradient).

        What must hold when it returns:

        * under ``no_sync`` (``self._sync_this_backward`` False) nothing happened at all;
        * a backward pass has started once (``self._backward_started``): at its first hook
          ``self._next_bucket`` and every bucket (``bucket.reset()``) were reset, and
          ``self.finish_gradient_synchronization`` was queued to run when backward ends
          (``torch.autograd.Variable._execution_engine.queue_callback``);
        * the parameter is marked ready in its bucket (``self.buckets[self._bucket_of[id(param)]]``,
          whose ``.ready`` holds ``id(param)``), with ``bucket.first_ready_s`` set at the bucket's
          first ready parameter and ``bucket.last_ready_s`` when it became full (``self._now()``:
          the timeline test reads them);
        * every complete bucket whose predecessors have all been launched has been launched
          (``self._launch``), bucket 0 first, and ``self._next_bucket`` is the first not launched.

        Why: collectives are matched by the order they are called in, not by name: if ranks launch
        their buckets in the order gradients arrive, two ranks can all-reduce different buckets at
        the same moment. And the hook runs once per parameter, in Python: it should only keep count.
        """
        raise NotImplementedError(
            "Exercise 1.3: the hook marks the parameter ready and launches complete buckets in index order"
        )

    def _launch(self, bucket: Bucket) -> None:
        """Exercise 1.3b: fill the bucket and start its asynchronous all-reduce.

        What must hold when it returns: ``bucket.launched_s`` is ``self._now()``; ``bucket.buffer``
        holds every gradient of the bucket (each in its slot: ``bucket.views`` are the slots, in
        the order of ``bucket.params``) divided by ``self.world_size``, copied in **one** call; and a
        sum of the buffer over ``self.process_group`` is in flight, not waited for, its handle in
        ``bucket.handle`` (a ``_Pending``: ``_Pending(work=...)`` for ``dist.all_reduce(...,
        async_op=True)``, ``_Pending(future=...)`` for a job of ``self._ring_thread``). With
        ``self.collective == "ring"`` the sum is your ``ring_all_reduce``, run on that thread, its
        bytes counted in ``self.ring_bytes`` (a ``ByteCounter``).

        Why: backward goes on computing earlier layers while the bucket travels; that overlap is
        what bucketing buys. One copy per bucket, not one per parameter: a Python call costs
        microseconds whatever the tensor's size.
        """
        raise NotImplementedError("Exercise 1.3: copy the bucket's gradients in, divide, start an async all-reduce")

    def finish_gradient_synchronization(self) -> None:
        """Exercise 1.4: wait for the buckets; the averages become the gradients.

        What must hold when it returns: every bucket's all-reduce is finished, and each parameter's
        ``.grad`` **is** its slot in the buffer (``self._slot(p)``, or ``bucket.views``: a view where
        the average is, no copy back); ``self.bytes_all_reduced`` is the bytes of all the buffers and
        ``self.steps_synchronised`` has counted one more step. A call with no backward in progress
        (``self._backward_started`` False) does nothing, so a second call is harmless. When some
        bucket was never launched (a parameter got no gradient), it raises RuntimeError naming those
        parameters instead of waiting.

        Why: PyTorch's DDP promises averaged gradients when ``loss.backward()`` returns, so the
        training loop does not change; gradients that are views of the buckets cost no memory of
        their own (``gradient_as_bucket_view=True``). Waiting for a bucket that was never launched
        would hang every rank: a named error is the only useful answer.
        """
        raise NotImplementedError("Exercise 1.4: wait for every bucket, make each .grad a view of its slot")
