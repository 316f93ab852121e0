"""Pipeline schedules written out by hand: for each stage, the list of operations it runs, in order.

A model cut into ``stages`` consecutive pieces trains a batch as ``micro_batches`` micro-batches.
An operation is ``("F", i)`` (the forward of micro-batch i on this stage) or ``("B", i)`` (its
backward). Stage s can run ``F i`` once stage s - 1 has sent it the activations of micro-batch i,
and ``B i`` once stage s + 1 has sent back their gradient (the last stage: once its own ``F i`` ran,
since the loss is computed there). A schedule is nothing more than these lists; the engine
(:mod:`.engine`) runs them with blocking receives, so a list in a bad order stops the pipeline.

* **GPipe** (Huang et al., 2019): every forward, then every backward. A stage keeps the activations
  of all m micro-batches until their backwards run.
* **1F1B** (one forward, one backward; PipeDream-Flush, Narayanan et al., 2021): stage s first runs
  ``p - 1 - s`` forwards (the *warm-up*: enough to fill the pipe below it), then alternates one
  forward and one backward (the *steady state*), then runs the backwards left (the *cool-down*).
  Its idle time is GPipe's, ``(p - 1) / (m + p - 1)`` of the step, but a stage never holds more
  than ``p - s`` micro-batches: at most p, however large m grows.

:func:`check_schedule` proves a set of lists deadlock-free *before* anything is sent: it plays
them on a clock (:func:`minigpt.zero.pipeline.simulate_orders`, Lab 02's simulator) and names the
stuck stages if they block each other. :func:`chart` draws the played schedule, one row a stage.
"""

from __future__ import annotations

from collections.abc import Callable

from minigpt.zero import pipeline as simulator

Op = tuple[str, int]  # ("F" or "B", micro-batch)


def gpipe(stage: int, stages: int, micro_batches: int) -> list[Op]:
    """GPipe's order, the same on every stage: all forwards, then all backwards."""
    return [("F", i) for i in range(micro_batches)] + [("B", i) for i in range(micro_batches)]


def one_f_one_b(stage: int, stages: int, micro_batches: int) -> list[Op]:
    """1F1B's order for ``stage``: a warm-up of forwards, then one forward and one backward in turn,
    then the backwards that are left."""
    warmup = min(stages - 1 - stage, micro_batches)  # forwards in flight before the first backward
    ops: list[Op] = [("F", i) for i in range(warmup)]
    next_backward = 0
    for i in range(warmup, micro_batches):  # steady state: F of the newest, B of the oldest
        ops.append(("F", i))
        ops.append(("B", next_backward))
        next_backward += 1
    ops.extend(("B", i) for i in range(next_backward, micro_batches))  # cool-down
    return ops


SCHEDULES: dict[str, Callable[[int, int, int], list[Op]]] = {"gpipe": gpipe, "1f1b": one_f_one_b}


def schedule_orders(schedule: Callable[[int, int, int], list[Op]], stages: int, micro_batches: int) -> list[list[Op]]:
    """Every stage's list (each rank computes all of them, to check them together)."""
    return [list(schedule(s, stages, micro_batches)) for s in range(stages)]


def check_schedule(orders: list[list[Op]], micro_batches: int) -> list[simulator.Op]:
    """The played schedule (F takes 1 unit, B 2), or ValueError: a stage that does not run every
    micro-batch's F and B exactly once, a B before its own F, or lists that deadlock."""
    expected = sorted([(kind, i) for kind in "FB" for i in range(micro_batches)])
    for s, order in enumerate(orders):
        ops = [tuple(op) for op in order]
        if sorted(ops) != expected:
            raise ValueError(
                f"stage {s}'s schedule {format_order(ops)} must run F and B of each of the "
                f"{micro_batches} micro-batches exactly once"
            )
        for i in range(micro_batches):
            if ops.index(("B", i)) < ops.index(("F", i)):
                raise ValueError(f"stage {s}'s schedule runs B{i} before F{i}")
    return simulator.simulate_orders([[tuple(op) for op in order] for order in orders])


def check_posting_order(orders: list[list[Op]]) -> None:
    """ValueError unless every wire carries its messages in the order both of its ends expect them:
    stages s and s + 1 run their forwards (the activations going down) and their backwards (the
    gradients coming back) in the same micro-batch order. A backend that matches messages by tag
    (gloo) does not need it; NCCL matches by posting order, so a schedule that breaks it would hand
    a stage another micro-batch's tensor of the same shape, without an error."""
    for s in range(len(orders) - 1):
        for kind, what in (("F", "forwards"), ("B", "backwards")):
            here = [i for k, i in orders[s] if k == kind]
            there = [i for k, i in orders[s + 1] if k == kind]
            if here != there:
                raise ValueError(
                    f"stages {s} and {s + 1} run their {what} in different micro-batch orders ({here} and {there}): "
                    "NCCL matches the messages between two ranks in the order they are posted, not by tag"
                )


def peak_held(order: list[Op]) -> int:
    """The most micro-batches whose activations a stage holds at once when it runs ``order``."""
    held = peak = 0
    for kind, _ in order:
        held += 1 if kind == "F" else -1
        peak = max(peak, held)
    return peak


def format_order(order: list[Op]) -> str:
    return " ".join(f"{kind}{i}" for kind, i in order)


def chart(played: list[simulator.Op]) -> str:
    """The played schedule as text, one row per stage, one column per time unit (a backward, two
    units, shows its name twice); ``.`` is idle."""
    stages = 1 + max(op.stage for op in played)
    width = int(max(op.end for op in played))
    cell = max(len(f"{op.kind}{op.micro_batch}") for op in played)
    rows = [["." * cell] * width for _ in range(stages)]
    for op in played:
        for t in range(int(op.start), int(op.end)):
            rows[op.stage][t] = f"{op.kind}{op.micro_batch}".ljust(cell)
    return "\n".join(f"stage {s}  " + " ".join(row) for s, row in enumerate(rows))
