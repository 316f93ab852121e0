"""What one training step sends, per worker, under DDP, ZeRO-1/2/3 and HSDP.

A step is a short list of collectives (:class:`Collective`), each over a group of devices and a
buffer. With ring algorithms a worker sends (N-1)/N of the buffer in a reduce-scatter or an
all-gather and 2(N-1)/N in an all-reduce (:func:`minigpt.zero.analytic.ring_factor`), so

    DDP      all-reduce(gradients)                               2(N-1)/N · Ψ · b_grad
    ZeRO-1   reduce-scatter(gradients) + all-gather(weights)     (N-1)/N · Ψ · (b_grad + b_param)
    ZeRO-2   the same as ZeRO-1 (the gradient shards are simply kept, not the whole)
    ZeRO-3   all-gather(weights) forward + again backward + reduce-scatter(gradients)
             = (N-1)/N · Ψ · (2 b_param + b_grad); 1 all-gather if the weights stay gathered
             between forward and backward (``reshard_after_forward=False``: ZeRO-2's memory for
             the weights)

which, with the ring factor taken as 1 and b = 1 element, is the ZeRO paper's 2Ψ, 2Ψ, 2Ψ, 3Ψ.

HSDP shards over S devices and replicates over R: the all-gathers and reduce-scatters run inside
the shard group (factor (S-1)/S, usually fast links inside a node) and each rank then all-reduces
its gradient shard, Ψ/S elements, with the R ranks holding the same shard (factor 2(R-1)/R,
across nodes).

:func:`unit_collectives` does the same accounting unit by unit (an FSDP unit, a layer of the
simulator), with each unit padded to a multiple of the group size the way real implementations
shard it, so it can be held against bytes counted on real runs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from minigpt.zero import analytic as za
from minigpt.zero.memory import _check_psi, _check_stage, recipe

GROUPS = ("data", "shard", "replica")  # all N devices; inside an HSDP shard group; across replicas


@dataclass(frozen=True)
class Collective:
    """One collective of a step: ``op`` on ``elements`` elements of ``element_bytes`` each."""

    op: str  # all-reduce, reduce-scatter or all-gather
    what: str  # "gradients" or "weights"
    group: str  # one of GROUPS
    group_size: int
    elements: float
    element_bytes: int
    count: int = 1  # how many times per step

    @property
    def buffer_bytes(self) -> float:
        return self.elements * self.element_bytes

    @property
    def bytes_sent(self) -> float:
        """Bytes one worker sends per step in this collective (ring algorithm)."""
        return self.count * za.ring_bytes_per_worker(self.buffer_bytes, self.group_size, self.op)


def step_collectives(
    psi: float,
    stage: int,
    shard_degree: int,
    replicas: int = 1,
    recipe_name: str = "mixed",
    reshard_after_forward: bool = True,
) -> list[Collective]:
    """The collectives of one step at ZeRO ``stage``, sharded over ``shard_degree`` devices and,
    for HSDP, replicated over ``replicas`` groups (``replicas=1``: plain ZeRO over N devices)."""
    _check_psi(psi)
    _check_stage(stage)
    za._positive_int("shard_degree", shard_degree)
    za._positive_int("replicas", replicas)
    rec = recipe(recipe_name)
    if stage == 0:
        if replicas != 1:
            raise ValueError(
                "DDP (stage 0) does not shard: give the world size as the shard "
                f"degree and replicas=1, not replicas={replicas}"
            )
        return [Collective("all-reduce", "gradients", "data", shard_degree, psi, rec.reduce_bytes)]
    group = "data" if replicas == 1 else "shard"
    gathers = 2 if stage == 3 and reshard_after_forward else 1
    collectives = [
        Collective("reduce-scatter", "gradients", group, shard_degree, psi, rec.reduce_bytes),
        Collective("all-gather", "weights", group, shard_degree, psi, rec.param_bytes, gathers),
    ]
    if replicas > 1:
        collectives.append(
            Collective("all-reduce", "gradients", "replica", replicas, psi / shard_degree, rec.reduce_bytes)
        )
    return collectives


@dataclass(frozen=True)
class StepTraffic:
    """Bytes one worker sends per step, inside its shard group and across replicas."""

    inside: float
    across: float

    @property
    def total(self) -> float:
        return self.inside + self.across


def traffic(collectives: Sequence[Collective]) -> StepTraffic:
    inside = sum(c.bytes_sent for c in collectives if c.group != "replica")
    across = sum(c.bytes_sent for c in collectives if c.group == "replica")
    return StepTraffic(inside, across)


def bytes_per_step(
    psi: float, stage: int, n_devices: int, recipe_name: str = "mixed", reshard_after_forward: bool = True
) -> float:
    """Bytes one of ``n_devices`` sends per step at ``stage`` (plain ZeRO, no HSDP)."""
    return traffic(step_collectives(psi, stage, n_devices, 1, recipe_name, reshard_after_forward)).total


def padded(elements: int, parts: int) -> int:
    """``elements`` rounded up to a multiple of ``parts``: what sharding into equal parts holds."""
    return parts * math.ceil(elements / parts)


def unit_collectives(
    unit_sizes: Sequence[int],
    stage: int,
    n_devices: int,
    param_bytes: int,
    grad_bytes: int,
    reshard_after_forward: Sequence[bool] | None = None,
    pad: bool = True,
    replicas: int = 1,
) -> list[Collective]:
    """A step's collectives unit by unit (each unit one bucket/FSDP unit of ``unit_sizes[i]``
    elements), each unit padded to a multiple of ``n_devices`` when ``pad``.

    ``reshard_after_forward[i]`` (stage 3) says whether unit i is all-gathered again in backward;
    FSDP2 never does it for the root unit, which backward needs first.

    ``replicas > 1`` is HSDP: ``n_devices`` is then the shard degree S, the gathers and scatters
    run in the ``shard`` group, and after each unit's reduce-scatter its gradient shard (the
    padded unit / S) is all-reduced over the ``replica`` group of ``replicas`` ranks.
    """
    _check_stage(stage)
    za._positive_int("n_devices", n_devices)
    za._positive_int("replicas", replicas)
    if replicas > 1 and stage == 0:
        raise ValueError(f"HSDP (replicas={replicas}) shards inside a group: it needs stage 1, 2 or 3, got stage 0")
    group = "data" if replicas == 1 else "shard"
    if reshard_after_forward is None:
        reshard_after_forward = [True] * len(unit_sizes)
    if len(reshard_after_forward) != len(unit_sizes):
        raise ValueError(f"{len(reshard_after_forward)} reshard flags for {len(unit_sizes)} units")
    out = []
    for size, reshard in zip(unit_sizes, reshard_after_forward):
        elements = padded(size, n_devices) if pad else size
        if stage == 0:
            out.append(Collective("all-reduce", "gradients", "data", n_devices, elements, grad_bytes))
            continue
        gathers = 2 if stage == 3 and reshard else 1
        out.append(Collective("all-gather", "weights", group, n_devices, elements, param_bytes, gathers))
        out.append(Collective("reduce-scatter", "gradients", group, n_devices, elements, grad_bytes))
        if replicas > 1:
            out.append(Collective("all-reduce", "gradients", "replica", replicas, elements / n_devices, grad_bytes))
    return out


def describe(collectives: Sequence[Collective]) -> str:
    """'all-reduce(gradients) + ...' in order, counts shown: a one-line summary of a step."""
    parts = []
    for c in collectives:
        name = f"{c.op}({c.what})"
        parts.append(f"{c.count} x {name}" if c.count > 1 else name)
    return " + ".join(parts)
