"""Context parallelism: causal attention over a sequence cut into ``cp`` slices, by ring attention.

Each of the ``cp`` ranks of a group holds a slice of the sequence's queries, keys and values,
``(B, H, T/cp, D)``. Attention needs every earlier key of each query, so the key/value blocks go
round a ring (Lab 01's pattern, :func:`minigpt.parallel.ring.exchange`: send to the right, receive
from the left, at the same time): in ``cp`` steps a rank meets every block, its own first, after
``cp - 1`` transfers. Bytes sent per rank in forward: ``(cp-1)/cp`` of the whole K and V.

**Online softmax.** The blocks arrive one at a time, so the softmax is merged as it goes (as in
FlashAttention): for each query row a running maximum ``m``, a running sum ``total`` of
``exp(score - m)`` and a running ``acc = sum exp(score - m) v``. A new block with scores ``s``
moves the maximum to ``m' = max(m, max s)``, rescales ``total`` and ``acc`` by ``exp(m - m')`` and adds
its own terms. At the end ``out = acc / total`` (and ``m + log total`` is the row's log-sum-exp). The result
is exact: the same softmax, summed in another order. The maximum is only a shift that the softmax
ignores, so it is detached (no gradient flows through it; the true gradient through it is zero).

**The causal mask, block by block.** Every block pair knows its tokens' global positions; a key is
visible when its position is at most the query's. A pair whose keys all come after all its queries
is skipped (no product at all); the own block is processed first, so every row has a finite
maximum before a row of a later pair can be entirely masked.

**Load balance.** With contiguous slices rank 0 skips every other block while the last rank
computes them all. ``load_balanced=True`` cuts the sequence into ``2 cp`` chunks and gives rank r
chunks ``r`` and ``2 cp - 1 - r`` (one early, one late: the same work on every rank).
:func:`split_sequence` and :func:`merge_sequence` cut and join either layout.

**Backward: autograd through the ring.** The ring is one autograd function (:class:`_KVRing`):
its forward runs the ``cp - 1`` exchanges and returns all ``cp`` blocks this rank met, stacked; its
backward runs the ring the other way, so that each rank ends with the gradient of its own K and V,
summed over every rank that used them. Everything else (the products, the online softmax) is
differentiated by autograd. It is plainly correct: autograd writes the attention's backward, and
one function keeps the order of the sends identical on every rank. What it costs in memory and
bytes against a hand-written ring-attention backward: :class:`_KVRing`, and Lab 05's page
(lab/05-tensor-and-context-parallel.md).

A sequence length that ``cp`` (or ``2 cp`` when load-balanced) does not divide raises ValueError
naming T and cp; there is no padding.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import torch
import torch.distributed as dist

from minigpt.parallel.ring import ByteCounter, exchange, ring_position
from minigpt.parallel.tensor_parallel.comm import Group

# The counter of ring attention's transfers in this process, unless one is passed in.
COUNTER = ByteCounter()


def _chunks(seq_len: int, cp: int, load_balanced: bool) -> int:
    parts = 2 * cp if load_balanced else cp
    if seq_len % parts:
        layout = "load-balanced (2 cp chunks)" if load_balanced else "contiguous"
        raise ValueError(f"sequence length T={seq_len} is not divisible into the {layout} slices of cp={cp}")
    return parts


def positions(seq_len: int, cp: int, rank: int, load_balanced: bool = False) -> torch.Tensor:
    """The global positions of rank ``rank``'s tokens, in the order it holds them."""
    parts = _chunks(seq_len, cp, load_balanced)
    size = seq_len // parts
    chunks = [rank, 2 * cp - 1 - rank] if load_balanced else [rank]
    return torch.cat([torch.arange(c * size, (c + 1) * size) for c in chunks])


def split_sequence(x: torch.Tensor, cp: int, rank: int, load_balanced: bool = False, dim: int = 2) -> torch.Tensor:
    """Rank ``rank``'s slice of ``x`` along ``dim`` (the sequence; 2 for ``(B, H, T, D)``)."""
    return x.index_select(dim, positions(x.shape[dim], cp, rank, load_balanced).to(x.device))


def merge_sequence(slices: list[torch.Tensor], load_balanced: bool = False, dim: int = 2) -> torch.Tensor:
    """The inverse of :func:`split_sequence`: every rank's slice, in rank order, back in order."""
    cp = len(slices)
    seq_len = sum(s.shape[dim] for s in slices)
    order = torch.cat([positions(seq_len, cp, r, load_balanced) for r in range(cp)])
    joined = torch.cat(slices, dim=dim)
    return joined.index_select(dim, torch.argsort(order).to(joined.device))


def block_mask(q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
    """Which keys each query of a block pair may see: ``(len(q_pos), len(k_pos))`` booleans, True
    where the key's **global** position is at most the query's. (With local positions every pair
    would get the diagonal block's triangle: a later query would miss all of an earlier block.)"""
    return k_pos.unsqueeze(0) <= q_pos.unsqueeze(1)


def online_softmax_step(
    m: torch.Tensor | None,
    total: torch.Tensor | None,
    acc: torch.Tensor | None,
    scores: torch.Tensor,
    v: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Merge one key/value block into the running softmax of each query row.

    ``m`` ``(..., Tq)`` the running maximum, ``total`` ``(..., Tq)`` the running sum of
    ``exp(score - m)``, ``acc`` ``(..., Tq, D)`` the running ``sum exp(score - m) v``; all three None
    before the first block. ``scores`` ``(..., Tq, Tk)`` (masked entries ``-inf``; every row of the
    first block has a finite one), ``v`` ``(..., Tk, D)``. Returns the new ``(m, total, acc)``: the
    maximum moves to ``m' = max(m, max scores)`` and the old sums are rescaled by ``exp(m - m')``
    before this block's terms are added. The maximum is detached (a shift the softmax ignores)."""
    block_max = scores.detach().amax(dim=-1)
    m_new = block_max if m is None else torch.maximum(m, block_max)
    p = torch.exp(scores - m_new.unsqueeze(-1))  # masked entries: exp(-inf) = 0
    if m is None:
        return m_new, p.sum(dim=-1), p @ v
    rescale = torch.exp(m - m_new)
    return m_new, total * rescale + p.sum(dim=-1), acc * rescale.unsqueeze(-1) + p @ v


class _KVRing(torch.autograd.Function):
    """Forward: ``kv`` (this rank's stacked K and V) round the ring; returns ``(cp, *kv.shape)``,
    entry ``j`` the block of rank ``rank - j``. Backward: the gradients back round the other way,
    each rank sending the accumulated gradient of the block it received last to the left and adding
    what comes from the right, so that after ``cp - 1`` transfers each rank holds the gradient of its
    own K and V, summed over every rank that used them.

    One function for the whole ring keeps the order of the sends identical on every rank: a rank
    that uses no received block still takes part, since its own block, always used, is in the same
    output. The price, against a hand-written ring-attention backward: every rank keeps all the
    blocks it met until backward (the whole K and V, not one block), and the backward sends the
    gradient blocks only (``(cp-1)/cp`` of K and V again, the same bytes as forward) where the
    hand-written one sends K, V and their gradients round again (twice as many; the theory's
    ``V_CP`` counts that design)."""

    @staticmethod
    def forward(ctx, kv: torch.Tensor, group: Group, counter: ByteCounter) -> torch.Tensor:
        ring = ring_position(group)
        ctx.group, ctx.counter = group, counter
        blocks = [kv.detach().contiguous()]
        for _ in range(ring.world_size - 1):
            incoming = torch.empty_like(blocks[0])
            exchange(ring, blocks[-1], incoming, counter)  # pass on the block received last
            blocks.append(incoming)
        return torch.stack(blocks)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        ring = ring_position(ctx.group)
        # the mirror ring: right and left swap; the accumulated gradient of entry j goes back to
        # the rank it came from, where it joins that rank's gradient of its entry j-1
        mirror = type(ring)(ring.world_size, ring.rank, ring.left, ring.right, ring.group)
        acc = grad[-1].contiguous()
        for j in range(ring.world_size - 1, 0, -1):
            incoming = torch.empty_like(acc)
            exchange(mirror, acc, incoming, ctx.counter)
            acc = grad[j - 1] + incoming
        return acc, None, None


def ring_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    group: Group = None,
    counter: ByteCounter | None = None,
    load_balanced: bool = False,
    computed: list[int] | None = None,
    kit=None,
) -> torch.Tensor:
    """Causal attention of this rank's queries over the whole sequence.

    ``q, k, v``: ``(B, H, T/cp, D)``, this rank's slice (:func:`split_sequence`, the same
    ``load_balanced`` layout). Returns ``(B, H, T/cp, D)``: this rank's rows of
    ``softmax(q k^T / sqrt(D) + causal mask) v``. ``counter`` (default :data:`COUNTER`) receives the
    bytes sent, forward and backward. ``computed``, when given, receives the rank owning each K/V
    block this rank multiplied with (the skipped, fully masked pairs are absent). ``kit`` (default
    the reference) supplies :func:`block_mask` and :func:`online_softmax_step`."""
    counter = COUNTER if counter is None else counter
    kit = SimpleNamespace(block_mask=block_mask, online_softmax_step=online_softmax_step) if kit is None else kit
    cp, rank = dist.get_world_size(group), dist.get_rank(group)
    local = q.shape[2]
    if k.shape != q.shape or v.shape != q.shape:
        raise ValueError(f"q, k, v must have one shape; got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    seq_len = local * cp
    q_pos = positions(seq_len, cp, rank, load_balanced).to(q.device)
    blocks = _KVRing.apply(torch.stack([k, v]), group, counter)  # (cp, 2, B, H, T/cp, D)
    scale = 1.0 / math.sqrt(q.shape[-1])
    m = total = acc = None
    for j in range(cp):
        owner = (rank - j) % cp
        visible = kit.block_mask(q_pos, positions(seq_len, cp, owner, load_balanced).to(q.device))
        if not visible.any():
            continue  # every key of this block comes after every query: nothing to compute
        if computed is not None:
            computed.append(owner)
        scores = (q @ blocks[j, 0].transpose(-2, -1)) * scale
        m, total, acc = kit.online_softmax_step(
            m, total, acc, scores.masked_fill(~visible, float("-inf")), blocks[j, 1]
        )
    return acc / total.unsqueeze(-1)


def ring_attention_bytes(batch: int, heads: int, seq_len: int, head_dim: int, cp: int, element_size: int = 4) -> float:
    """Bytes one rank sends in forward (and again in backward) of :func:`ring_attention`:
    ``(cp-1)/cp`` of the whole sequence's K and V, ``2 B H T D`` elements."""
    return (cp - 1) / cp * 2 * batch * heads * seq_len * head_dim * element_size
