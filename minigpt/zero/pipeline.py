"""Pipeline schedules, simulated: when each stage runs each micro-batch's forward and backward.

A model cut into ``stages`` consecutive pieces runs a batch as ``micro_batches`` micro-batches.
Stage s may run the forward of micro-batch i once stage s - 1 has finished it, and its backward
once stage s + 1 has finished that backward. Each stage runs its own list of operations in order,
each as early as its inputs allow. Two orders:

* ``gpipe`` (Huang et al., 2019): every forward, then every backward. A stage keeps the
  activations of all m micro-batches until their backwards run.
* ``1f1b`` (one forward, one backward; PipeDream-Flush, Narayanan et al., 2021): stage s runs
  p - 1 - s forwards to fill the pipe, then alternates one forward and one backward, then drains.
  The idle time is the same as GPipe's; a stage never holds more than p - s micro-batches.

The simulation measures what :func:`minigpt.zero.analytic.bubble_fraction` predicts.
"""

from __future__ import annotations

from dataclasses import dataclass

SCHEDULES = ("gpipe", "1f1b")


@dataclass(frozen=True)
class Op:
    stage: int
    kind: str  # "F" or "B"
    micro_batch: int
    start: float
    end: float


def stage_order(schedule: str, stage: int, stages: int, micro_batches: int) -> list[tuple[str, int]]:
    """The (kind, micro-batch) operations stage ``stage`` runs, in order."""
    m = micro_batches
    if schedule == "gpipe":
        return [("F", i) for i in range(m)] + [("B", i) for i in range(m)]
    if schedule == "1f1b":
        warmup = min(stages - 1 - stage, m)
        order = [("F", i) for i in range(warmup)]
        for i in range(warmup, m):
            order += [("F", i), ("B", i - warmup)]
        order += [("B", i) for i in range(m - warmup, m)]
        return order
    raise ValueError(f"schedule must be one of {SCHEDULES}, got {schedule!r}")


def simulate(
    schedule: str, stages: int, micro_batches: int, forward_time: float = 1.0, backward_time: float = 2.0
) -> list[Op]:
    """Run the schedule: every operation starts when its stage is free and its input is ready."""
    for name, value in (("stages", stages), ("micro_batches", micro_batches)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    orders = [stage_order(schedule, s, stages, micro_batches) for s in range(stages)]
    return simulate_orders(orders, forward_time, backward_time)


class Deadlock(ValueError):
    """Some stage waits for an operation that can never run."""


def simulate_orders(
    orders: list[list[tuple[str, int]]], forward_time: float = 1.0, backward_time: float = 2.0
) -> list[Op]:
    """Run explicit per-stage orders (``orders[s]`` is the list of ``(kind, micro-batch)`` stage s
    runs, in order), each operation as early as its stage and its input allow. Raises
    :class:`Deadlock` naming every stuck stage and what it waits for when no stage can go on."""
    stages = len(orders)
    done: dict[tuple[int, str, int], float] = {}  # (stage, kind, micro-batch) -> end time
    free_at = [0.0] * stages
    position = [0] * stages
    ops: list[Op] = []
    while any(position[s] < len(orders[s]) for s in range(stages)):
        progressed, waiting = False, []
        for s in range(stages):
            if position[s] == len(orders[s]):
                continue
            kind, i = orders[s][position[s]]
            if kind == "F":
                needs = (s - 1, "F", i) if s > 0 else None
            else:
                needs = (s + 1, "B", i) if s < stages - 1 else (s, "F", i)
            if needs is not None and needs not in done:
                waiting.append(f"stage {s} waits before {kind}{i} for {needs[1]}{needs[2]} of stage {needs[0]}")
                continue
            start = max(free_at[s], done[needs] if needs else 0.0)
            end = start + (forward_time if kind == "F" else backward_time)
            done[(s, kind, i)] = free_at[s] = end
            ops.append(Op(s, kind, i, start, end))
            position[s] += 1
            progressed = True
        if not progressed:
            raise Deadlock("the schedule deadlocks: " + "; ".join(waiting))
    return ops


def measured_bubble_fraction(ops: list[Op]) -> float:
    """Idle device time over total device time, from a simulated schedule."""
    stages = 1 + max(op.stage for op in ops)
    makespan = max(op.end for op in ops)
    busy = sum(op.end - op.start for op in ops)
    return 1 - busy / (stages * makespan)


def peak_in_flight(ops: list[Op], stage: int) -> int:
    """The most micro-batches whose activations ``stage`` holds at once (forwards not yet
    matched by their backward)."""
    held = peak = 0
    for op in sorted((op for op in ops if op.stage == stage), key=lambda op: op.start):
        held += 1 if op.kind == "F" else -1
        peak = max(peak, held)
    return peak
