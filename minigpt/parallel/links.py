"""What a link costs, and a ring that crosses fewer of the slow ones.

**The α–β model.** Sending one message of ``n`` bytes over a link takes about ``α + n/β``: a fixed
latency α (software, the network's round trip) plus the bytes over the bandwidth β. Two numbers,
fitted to measured times by least squares (:func:`fit_alpha_beta`), predict every collective
built from messages. A ring all-reduce of ``S`` bytes on ``N`` ranks is ``2(N-1)`` steps of one
``S/N``-byte message each (:mod:`minigpt.parallel.ring`), so it takes about
``2(N-1)(α + S/(Nβ))`` (:func:`ring_all_reduce_seconds`): latency-bound for small buckets,
bandwidth-bound for big ones.

**Hierarchical all-reduce.** Ranks live on nodes: fast links inside a node (NVLink, shared
memory), slow ones between nodes (Ethernet, InfiniBand). A flat ring over all ``N`` ranks crosses a
node boundary on ``M`` of its links (``M`` nodes) and every step of the ring waits for them.
:func:`hierarchical_all_reduce` does the same sum in three rings: a reduce-scatter inside each
node (each of the ``L`` local ranks ends with ``1/L`` of the sum over its node), an all-reduce
across nodes of those pieces (``L`` rings of ``M`` ranks, one per local index, side by side), and an
all-gather inside each node. Only the middle ring crosses nodes, carrying ``1/L`` of the tensor,
in ``2(M-1)`` steps instead of ``2(N-1)``. :func:`crossing_bytes` counts both ways.

Lab 01's page (section "What a link costs") fits α and β on this machine, holds the prediction
against measured ring all-reduces of Lab 01's buckets, and runs the hierarchical ring on two
simulated nodes: ``lab/01_links.py``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from minigpt.parallel import ring


def fit_alpha_beta(sizes: list[float], seconds: list[float]) -> tuple[float, float]:
    """The line ``seconds ≈ α + size/β`` through the points: ``(α in seconds, β in bytes per second)``.
    Each point is weighted by its relative error (weight ``1/t²``), so that a 1 kB message counts as
    much as a 16 MB one: unweighted, the largest sizes would set the line alone and the intercept, the
    latency, would be lost in their noise. Needs two distinct sizes or more and times that grow."""
    if len(sizes) != len(seconds) or len(set(sizes)) < 2 or min(seconds) <= 0:
        raise ValueError(f"need positive times at two sizes or more, got sizes {sizes} and times {seconds}")
    w = [1.0 / t**2 for t in seconds]
    s_w, s_x, s_t = sum(w), sum(wi * x for wi, x in zip(w, sizes)), sum(wi * t for wi, t in zip(w, seconds))
    s_xx = sum(wi * x * x for wi, x in zip(w, sizes))
    s_xt = sum(wi * x * t for wi, x, t in zip(w, sizes, seconds))
    slope = (s_w * s_xt - s_x * s_t) / (s_w * s_xx - s_x**2)
    if slope <= 0:
        raise ValueError(f"the times do not grow with the size (slope {slope:.3g} s/B): no bandwidth to fit")
    return (s_t - slope * s_x) / s_w, 1.0 / slope


def message_seconds(size: float, alpha: float, beta: float) -> float:
    """One message of ``size`` bytes: ``α + size/β``."""
    return alpha + size / beta


def ring_all_reduce_seconds(size: float, world: int, alpha: float, beta: float) -> float:
    """A ring all-reduce of ``size`` bytes on ``world`` ranks: ``2(N-1)`` messages of ``size/N``."""
    return 2 * (world - 1) * message_seconds(size / world, alpha, beta)


@dataclass(frozen=True)
class Nodes:
    """This rank's two rings: ``inside`` (its node's ranks) and ``across`` (the ranks of every node that
    share its local index). ``node_size`` ranks per node, numbered node by node as torchrun does."""

    node_size: int
    nodes: int
    inside: dist.ProcessGroup
    across: dist.ProcessGroup


def node_groups(node_size: int) -> Nodes:
    """Every rank calls this with the same ``node_size`` (creating a group is collective): the world
    cut into nodes of ``node_size`` consecutive ranks."""
    world, rank = dist.get_world_size(), dist.get_rank()
    if node_size < 1 or world % node_size:
        raise ValueError(f"node size {node_size} does not divide the world of {world} ranks")
    nodes = world // node_size
    inside = across = None
    for node in range(nodes):  # the same calls in the same order on every rank
        group = dist.new_group(list(range(node * node_size, (node + 1) * node_size)))
        if rank // node_size == node:
            inside = group
    for local in range(node_size):
        group = dist.new_group(list(range(local, world, node_size)))
        if rank % node_size == local:
            across = group
    return Nodes(node_size, nodes, inside, across)


def hierarchical_all_reduce(
    tensor: torch.Tensor,
    nodes: Nodes,
    inside: ring.ByteCounter | None = None,
    across: ring.ByteCounter | None = None,
) -> torch.Tensor:
    """Sum ``tensor`` over every rank, in place, crossing nodes only with this rank's share of its
    node's sum. ``inside`` and ``across`` count the bytes of the rings inside and across nodes."""
    inside = ring.ByteCounter() if inside is None else inside
    across = ring.ByteCounter() if across is None else across
    share = ring.ring_reduce_scatter(tensor, "sum", nodes.inside, inside)  # a view into tensor
    ring.ring_all_reduce(share, "sum", nodes.across, across)
    return ring.ring_all_gather(tensor, nodes.inside, inside)


def crossing_bytes(size: int, world: int, node_size: int) -> dict[str, float]:
    """Bytes that cross a node boundary for one all-reduce of ``size`` bytes, when ``node_size`` divides
    the world and the chunks divide evenly: in total, and on the busiest link between nodes.

    Flat ring: the last rank of each node sends to the next node, ``2(N-1)/N · S`` bytes each, so
    ``M`` links carry that much. Hierarchical: every rank sends ``2(M-1)/M · S/L`` bytes to the other
    nodes (its share of the ring across)."""
    nodes = world // node_size
    flat_link = 2 * (world - 1) / world * size
    hier_link = 2 * (nodes - 1) / nodes * size / node_size
    return {
        "flat_total": nodes * flat_link,
        "flat_link": flat_link,
        "hierarchical_total": world * hier_link,
        "hierarchical_link": hier_link,
    }
