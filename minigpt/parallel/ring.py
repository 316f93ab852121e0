"""Ring collectives written on point-to-point ``send``/``recv``, with byte counters.

N ranks stand in a ring: rank r sends only to its right neighbour r+1 and receives only from its
left neighbour r-1 (modulo N). A tensor of S elements is cut into N chunks (:func:`chunk_bounds`;
when N does not divide S the first ``S % N`` chunks are one element longer, so no padding is
sent). Every step, every rank sends one chunk and receives one chunk, all at the same time:

* **reduce-scatter** (N-1 steps): at step s, rank r sends chunk (r-s-1) and receives chunk
  (r-s-2), which it adds to its own copy. A chunk travels once round the ring gathering one term
  per rank, so after N-1 steps rank r holds the complete sum of chunk r.
* **all-gather** (N-1 steps): at step s, rank r sends chunk (r-s) and receives chunk (r-s-1),
  which it stores. After N-1 steps every rank holds every finished chunk.
* **all-reduce** = reduce-scatter followed by all-gather.

Bytes sent per rank: reduce-scatter sends every chunk but its own, all-gather every chunk but its
right neighbour's, so with chunks of S/N elements of b bytes

    reduce-scatter, all-gather:  (N-1)/N * S * b         all-reduce:  2(N-1)/N * S * b

exactly when N divides S; otherwise the count is S*b minus the size of the chunk(s) not sent
(the chunks differ by at most one element). The counters record what was really passed to
``send``/``recv``, so a "ring" that sends whole tensors is caught by its byte count.

Every function works in place on a contiguous tensor of any shape (viewed as 1-D), for any world
size >= 1, in the process group ``group`` (default: all ranks).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

OPS = ("sum", "avg")


@dataclass
class ByteCounter:
    """What this rank passed to point-to-point calls since the last :meth:`reset`."""

    sent: int = 0
    received: int = 0
    messages: int = 0

    def reset(self) -> None:
        self.sent = self.received = self.messages = 0


# One counter per process, that is per rank. Pass your own to count one call on its own.
COUNTER = ByteCounter()


def chunk_bounds(length: int, parts: int) -> list[tuple[int, int]]:
    """``parts`` contiguous ``(start, stop)`` ranges covering ``range(length)``, sizes differing
    by at most one (the first ``length % parts`` ranges are the longer ones)."""
    if parts < 1:
        raise ValueError(f"cannot cut a tensor into {parts} chunks; need at least 1")
    base, extra = divmod(length, parts)
    bounds, start = [], 0
    for i in range(parts):
        stop = start + base + (1 if i < extra else 0)
        bounds.append((start, stop))
        start = stop
    return bounds


@dataclass(frozen=True)
class RingPosition:
    world_size: int
    rank: int  # this process's rank inside the group
    right: int  # global ranks of the neighbours (point-to-point calls take global ranks)
    left: int
    group: dist.ProcessGroup | None


def ring_position(group: dist.ProcessGroup | None = None) -> RingPosition:
    """This rank's place in the ring of ``group``: world size, rank, and both neighbours."""
    world, rank = dist.get_world_size(group), dist.get_rank(group)

    def global_rank(r: int) -> int:
        return r if group is None else dist.get_global_rank(group, r)

    return RingPosition(world, rank, global_rank((rank + 1) % world), global_rank((rank - 1) % world), group)


def _flat(tensor: torch.Tensor) -> torch.Tensor:
    if not tensor.is_contiguous():
        raise ValueError("ring collectives work in place on a contiguous tensor; call .contiguous() first")
    return tensor.view(-1)


def _check_op(op: str, tensor: torch.Tensor) -> None:
    if op not in OPS:
        raise ValueError(f"op {op!r} is not supported; use one of {', '.join(OPS)}")
    if op == "avg" and not tensor.is_floating_point():
        raise ValueError(f"op 'avg' needs a floating-point tensor, got {tensor.dtype}")


def exchange(ring: RingPosition, outgoing: torch.Tensor, incoming: torch.Tensor, counter: ByteCounter) -> None:
    """Send ``outgoing`` to the right neighbour while receiving ``incoming`` from the left one.
    The send is posted first and asynchronously, so no rank waits for another to receive."""
    request = dist.isend(outgoing, dst=ring.right, group=ring.group) if outgoing.numel() else None
    if incoming.numel():
        dist.recv(incoming, src=ring.left, group=ring.group)
    if request is not None:
        request.wait()
    counter.sent += outgoing.numel() * outgoing.element_size()
    counter.received += incoming.numel() * incoming.element_size()
    counter.messages += 1


def ring_reduce_scatter(
    tensor: torch.Tensor, op: str = "sum", group: dist.ProcessGroup | None = None, counter: ByteCounter | None = None
) -> torch.Tensor:
    """Reduce ``tensor`` over the ranks, chunk by chunk; this rank ends with the finished chunk
    ``chunk_bounds(tensor.numel(), world_size)[rank]`` and returns a view of it. The other chunks
    of ``tensor`` are left holding partial sums (the tensor is the work buffer)."""
    _check_op(op, tensor)
    counter = COUNTER if counter is None else counter
    flat, ring = _flat(tensor), ring_position(group)
    n, r = ring.world_size, ring.rank
    bounds = chunk_bounds(flat.numel(), n)
    for step in range(n - 1):
        s0, s1 = bounds[(r - step - 1) % n]
        r0, r1 = bounds[(r - step - 2) % n]
        incoming = torch.empty(r1 - r0, dtype=flat.dtype, device=flat.device)
        exchange(ring, flat[s0:s1], incoming, counter)
        flat[r0:r1] += incoming
    mine = flat[bounds[r][0] : bounds[r][1]]
    if op == "avg":
        mine /= n
    return mine


def ring_all_gather(
    tensor: torch.Tensor, group: dist.ProcessGroup | None = None, counter: ByteCounter | None = None
) -> torch.Tensor:
    """Each rank brings chunk ``rank`` of ``tensor`` (the rest is overwritten); every rank ends
    with every chunk. Returns ``tensor``."""
    counter = COUNTER if counter is None else counter
    flat, ring = _flat(tensor), ring_position(group)
    n, r = ring.world_size, ring.rank
    bounds = chunk_bounds(flat.numel(), n)
    for step in range(n - 1):
        s0, s1 = bounds[(r - step) % n]
        r0, r1 = bounds[(r - step - 1) % n]
        exchange(ring, flat[s0:s1], flat[r0:r1], counter)  # received straight into place
    return tensor


def ring_all_reduce(
    tensor: torch.Tensor, op: str = "sum", group: dist.ProcessGroup | None = None, counter: ByteCounter | None = None
) -> torch.Tensor:
    """Sum (or average) ``tensor`` over the ranks, in place: a ring reduce-scatter, then a ring
    all-gather. Every rank ends with the same bits. Returns ``tensor``."""
    ring_reduce_scatter(tensor, op, group, counter)
    return ring_all_gather(tensor, group, counter)
