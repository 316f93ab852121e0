"""The PyTorch profiler's trace of a few training steps: the file a learner opens on real hardware.

``--trace DIR`` (Labs 01, 03 and 04) records a few steps after the first ones (which allocate and
warm caches) with ``torch.profiler`` and writes one Chrome trace JSON per rank, gzipped (a tenth of
the size), ``DIR/<name>-rank<r>.json.gz``. Perfetto (ui.perfetto.dev, "Open trace file") and
``chrome://tracing`` open it as it is: one row per thread,
one bar per operator. Each traced step is a bar of its own, labelled ``<what> step <s>`` by the lab,
so the steps of two systems trained side by side (a ``--check``) are told apart.

Where to look:

* **backward** runs on the training thread: the bars named ``autograd::engine::evaluate_function: ...``;
* **collectives** on gloo run on gloo's own threads (``pt_gloo_runloop``): bars named ``gloo:all_reduce``,
  ``gloo:all_gather``, ...; the bar is the time the collective took, from its start on that thread to
  its end. On a GPU, NCCL's collectives are kernels on their own CUDA stream (``ncclDevKernel_...``).

A collective whose bar lies under backward's bars is hidden behind computation: the overlap DDP and
FSDP are built for. :func:`read` checks that a file is a Chrome trace and :func:`steps` measures, for
each traced step, when backward ran, when each collective ran and how much of it overlapped backward:
the numbers the lab pages quote, read from the trace's events and nothing else.
"""

from __future__ import annotations

import bisect
import gzip
import json
import os
from contextlib import contextmanager
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, record_function

TRACE_STEPS = 3  # steps recorded
FIRST_STEP = 5  # the first one recorded: after the steps that allocate and warm caches
BACKWARD = "autograd::engine::evaluate_function: "
COLLECTIVE_PREFIXES = ("gloo:", "nccl:")


def traced_steps(total: int, steps: int = TRACE_STEPS) -> range:
    """The steps a run of ``total`` steps records: ``steps`` of them, from step :data:`FIRST_STEP` when
    the run is long enough, else its last ones."""
    first = max(0, min(FIRST_STEP, total - steps))
    return range(first, min(total, first + steps))


class StepTrace:
    """The profiler around the traced steps of one run on this rank: :meth:`step` labels each step
    (a ``record_function`` bar) and starts the profiler at the first traced step; :meth:`close` after
    the last one writes the trace. With ``folder`` None it does nothing (no profiler at all)."""

    def __init__(
        self,
        folder: str | Path | None,
        name: str,
        rank: int,
        device: torch.device,
        total_steps: int,
        steps: int = TRACE_STEPS,
    ):
        self.path = None if folder is None else Path(folder) / f"{name}-rank{rank}.json.gz"
        self.steps = traced_steps(total_steps, steps)
        self.profiler = None
        self.started = False
        if self.path is not None:
            activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
            self.profiler = profile(activities=activities)

    @contextmanager
    def step(self, step: int, what: str):
        """One step of ``what`` (the system trained): a labelled bar while the profiler records."""
        if self.profiler is None or step not in self.steps:
            yield
            return
        if not self.started:
            self.profiler.start()
            self.started = True
        with record_function(f"{what} step {step}"):
            yield

    def done_with(self, step: int) -> Path | None:
        """Call after every step: after the last traced one the profiler stops and the trace is written
        (a temporary file, then a rename: never half a trace). Returns the path written, or None."""
        if self.profiler is None or step != self.steps[-1] or not self.started:
            return None
        self.profiler.stop()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{self.path.name}.part.gz")  # torch gzips a name that ends in .gz
        self.profiler.export_chrome_trace(str(tmp))
        os.replace(tmp, self.path)
        self.profiler = None
        return self.path


# ----------------------------------------------------------------------------------------------
# Reading a trace


def read(path: str | Path) -> list[dict]:
    """The complete events (``"ph": "X"``: a name, a start ``ts`` and a duration ``dur``, in
    microseconds) of a Chrome trace file (gzipped when its name ends in ``.gz``), sorted by start, or
    ValueError saying why the file is not one."""
    try:
        raw = Path(path).read_bytes()
        data = json.loads(gzip.decompress(raw) if str(path).endswith(".gz") else raw)
    except (OSError, EOFError, UnicodeDecodeError, ValueError) as exc:
        raise ValueError(f"{path}: not a Chrome trace JSON file ({exc})") from None
    events = data.get("traceEvents") if isinstance(data, dict) else data
    if not isinstance(events, list):
        raise ValueError(f"{path}: not a Chrome trace (no traceEvents list)")
    complete = [e for e in events if isinstance(e, dict) and e.get("ph") == "X"]
    for e in complete:
        if not isinstance(e.get("name"), str) or not all(isinstance(e.get(k), (int, float)) for k in ("ts", "dur")):
            raise ValueError(f"{path}: an event without a name, ts or dur: {str(e)[:200]}")
    return sorted(complete, key=lambda e: e["ts"])


def is_collective(event: dict) -> bool:
    name = event["name"]
    return name.startswith(COLLECTIVE_PREFIXES) or (event.get("cat") == "kernel" and "nccl" in name.lower())


def _overlap(a: tuple[float, float], b: tuple[float, float]) -> float:
    return max(0.0, min(a[1], b[1]) - max(a[0], b[0]))


def _union_length(spans: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for start, stop in sorted(spans):
        if stop > end:
            total += stop - max(start, end)
            end = stop
    return total


def steps(events: list[dict], what: str) -> list[dict]:
    """For each traced step of ``what`` (the bars ``<what> step <s>``): in milliseconds from the step's
    start, when backward ran (its first and last ``evaluate_function`` bar on the step's thread), and
    each collective that started during the step (name, start, end, and how much of it ran while
    backward did); the share of the collectives' time hidden under backward, and the time they ran
    outside it (*exposed*: what the step waits for, or a collective that backward does not cover).
    ``events`` sorted by start (as :func:`read` returns them)."""
    starts = [e["ts"] for e in events]
    found = []
    for label in (e for e in events if e["name"].startswith(f"{what} step ")):  # one bar per traced step
        start, end = label["ts"], label["ts"] + label["dur"]
        inside = events[bisect.bisect_left(starts, start) : bisect.bisect_right(starts, end)]
        backward = [e for e in inside if e["name"].startswith(BACKWARD) and e.get("tid") == label.get("tid")]
        back = (min(e["ts"] for e in backward), max(e["ts"] + e["dur"] for e in backward)) if backward else (end, end)
        spans = [(e["ts"], e["ts"] + e["dur"], e["name"]) for e in inside if is_collective(e)]
        collectives = [
            {
                "name": name,
                "start_ms": (s - start) / 1e3,
                "end_ms": (t - start) / 1e3,
                "under_backward_ms": _overlap((s, t), back) / 1e3,
            }
            for s, t, name in spans
        ]
        busy = _union_length([(s, t) for s, t, _ in spans])
        hidden = _union_length([(max(s, back[0]), min(t, back[1])) for s, t, _ in spans if _overlap((s, t), back)])
        found.append(
            {
                "step": int(label["name"].rsplit(" ", 1)[1]),
                "step_ms": label["dur"] / 1e3,
                "backward_ms": [(back[0] - start) / 1e3, (back[1] - start) / 1e3],
                "collectives": collectives,
                "collective_ms": busy / 1e3,
                "hidden_ms": hidden / 1e3,
                "hidden_share": hidden / busy if busy else 0.0,
                "exposed_ms": (busy - hidden) / 1e3,
            }
        )
    return found


def summarize(path: str | Path, whats: list[str]) -> dict[str, dict]:
    """What the trace at ``path`` shows of each system of ``whats`` (its traced steps: :func:`steps`),
    for a report: ``{what: {"file", "what", "steps"}}``."""
    events = read(path)
    return {what: {"file": str(path), "what": what, "steps": steps(events, what)} for what in whats}


def describe(summary: dict) -> str:
    """One line on the last traced step of a :func:`summarize`: backward, the collectives by name, how
    many started before backward ended, and how much of their time backward hid."""
    last = summary["steps"][-1]
    names: dict[str, int] = {}
    for c in last["collectives"]:
        names[c["name"]] = names.get(c["name"], 0) + 1
    kinds = ", ".join(f"{n} x {name}" for name, n in names.items()) or "no collective"
    started = sum(c["start_ms"] < last["backward_ms"][1] for c in last["collectives"])
    return (
        f"{summary['file']} (open it in ui.perfetto.dev) | {summary['what']} step {last['step']}: backward "
        f"{last['backward_ms'][1] - last['backward_ms'][0]:.1f} ms; {kinds}, {started} started before backward "
        f"ended; {100 * last['hidden_share']:.0f}% of their time under backward, {last['exposed_ms']:.1f} ms not"
    )
