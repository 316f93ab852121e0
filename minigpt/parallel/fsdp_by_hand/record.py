"""What our FSDP did in a step, written down as it happens: the schedule, the bytes, the memory.

A :class:`Recorder` is optional (``fully_shard(..., recorder=...)``); the units call it at each
event. It keeps, per step:

* ``schedule`` - the training thread's order of ``"all-gather U"`` (issued), ``"forward U"`` and
  ``"backward U"`` (a block's computation is about to start, its parameters whole),
  ``"free U"`` (its gathered parameters released) and ``"reduce-scatter U"``: the same words
  Lab 03's tracer writes for PyTorch's FSDP2, so the two lists can be compared item by item
  (the root's own forward and backward, which wrap the blocks', are in the timeline only);
* ``collectives`` - each all-gather, reduce-scatter and all-reduce with its unit, its sizes and
  the bytes this rank *sends*, counted as a ring sends them (Lab 01): an all-gather or a
  reduce-scatter of a buffer of S bytes on N ranks sends (N-1)/N * S, an all-reduce twice that;
* ``timeline`` - ``(t, what, unit, held)`` with ``time.perf_counter()`` seconds since the step
  began, every event (also ``gathered``: when the waiting thread found an all-gather done,
  and ``freeing``: just before a unit's gathered parameters are freed, in backward the moment
  its full gradients and its parameters are both alive) and the bytes held at that moment;
* ``completions`` - when each asynchronous all-gather (a prefetch) finished, seen from the
  communication thread: between its issue and its completion the training thread computed;
* ``held`` - at every event, the bytes of parameters and gradients this rank holds, read from
  the tensors' storages themselves (a freed gathered parameter has a storage of 0 bytes), and
  its peak over the step.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field


def ring_sent_bytes(kind: str, full_bytes: int, world_size: int) -> int:
    """Bytes one rank sends when a ring runs ``kind`` on a buffer of ``full_bytes`` bytes that
    ``world_size`` divides (our buffers are padded so that it always does)."""
    once = full_bytes * (world_size - 1) // world_size
    return 2 * once if kind == "all-reduce" else once


@dataclass
class Step:
    schedule: list[str] = field(default_factory=list)
    collectives: list[dict] = field(default_factory=list)
    timeline: list[tuple[float, str, str, int]] = field(default_factory=list)  # (t, what, unit, held)
    peak_held: int = 0
    completions: list[tuple[float, str]] = field(default_factory=list)  # (t, unit): async all-gather done

    def bytes_sent(self, kinds: tuple[str, ...] = ("all-gather", "reduce-scatter")) -> int:
        return sum(c["sent_bytes"] for c in self.collectives if c["kind"] in kinds)


class Recorder:
    """Collects :class:`Step` records; ``with recorder.step(): ...`` around each step."""

    def __init__(self) -> None:
        self.steps: list[Step] = []
        self._t0 = 0.0
        self._census = None  # callable -> bytes held, set by the root unit

    def begin(self) -> None:
        self.steps.append(Step())
        self._t0 = time.perf_counter()

    @property
    def current(self) -> Step | None:
        return self.steps[-1] if self.steps else None

    def now(self) -> float:
        return time.perf_counter() - self._t0

    def event(self, what: str, unit: str, in_schedule: bool = True) -> None:
        step = self.current
        if step is None:
            return
        if in_schedule:
            step.schedule.append(f"{what} {unit}")
        held = self._census() if self._census is not None else 0
        step.timeline.append((self.now(), what, unit, held))
        step.peak_held = max(step.peak_held, held)

    def completed(self, unit: str) -> None:
        """An asynchronous all-gather finished (called on the communication thread)."""
        step = self.current
        if step is not None:
            step.completions.append((self.now(), unit))

    def collective(self, kind: str, unit: str, numel: int, element_size: int, world_size: int, is_async: bool) -> None:
        step = self.current
        if step is None:
            return
        full = numel * element_size
        step.collectives.append(
            {
                "kind": kind,
                "unit": unit,
                "numel": numel,
                "element_size": element_size,
                "async": is_async,
                "sent_bytes": ring_sent_bytes(kind, full, world_size),
            }
        )
