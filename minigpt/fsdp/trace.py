"""Watching a real FSDP run: which all-gather was issued when, what it carried, what it cost.

PyTorch's FSDP is not edited. For the length of a ``with FSDPTracer(...)`` block the tracer puts
thin wrappers around a few of FSDP's own methods (which ones, per flavour: :class:`FSDPTracer`)
and around the ``torch.distributed`` functions FSDP calls, adds hooks on every transformer block,
and takes all of it away again on exit. Each rank records its own events; times are
``time.perf_counter()`` seconds since the step began.

What is recorded, per rank and per step:

* **compute** - hooks on each block mark its computation: ``forward start`` (after FSDP's
  pre-forward has made the parameters whole), ``forward end`` (before FSDP reshards them),
  ``backward start`` (a gradient hook on the block's output, registered after FSDP's own, so it
  fires once FSDP's pre-backward unshard has returned) and ``backward end`` (a full backward hook
  on the block: the gradient of its input is complete). A full backward hook puts an identity
  step around the block's input and output; it changes no number.
* **collectives** - every call FSDP makes to a function of :data:`TRACED_COLLECTIVES` (its
  all-gathers, reduce-scatters and all-reduces), with the *unit* it belongs to (the FSDP module
  whose parameters move: ``root``, ``blocks.0``, ...), whether it is a *prefetch* (issued on behalf
  of a later unit), whether it is asynchronous, and its tensor sizes. ``issued`` is the moment of
  the call; ``done`` is when the call returns (a blocking call) or when the collective completes
  (an asynchronous call: a callback on its future, run by the communication thread).
* **waits** - the time the training thread spends inside ``Work.wait()`` for an asynchronous
  collective the tracer saw being issued.

Definitions used in the lab's report:

* **Bytes per rank** is counted as Lab 01 counts a ring (:func:`ring_bytes_sent`): the bytes this
  rank *sends*. A ring all-gather of a full buffer of S elements sends every chunk but one,
  (N-1)/N * S; a reduce-scatter the same; an all-reduce both. The raw input and output sizes are
  kept too, and show FSDP's padding (:class:`Collective`).
* **Exposed communication** is the time the training thread is blocked on communication: the
  whole duration of a blocking collective call, plus the time spent in ``Work.wait()`` for an
  asynchronous one. A collective that runs in the background while the thread computes costs
  nothing exposed: that is what overlap means. A blocked rank may also be waiting for a slower
  peer to join the collective: that time is exposed too, and on a busy machine it is often most
  of it. On a CPU with gloo a blocking call blocks: only asynchronous all-gathers can overlap
  computation. (On a GPU every time here is when the host issued or learned of the work;
  device times need the PyTorch profiler.)
"""

from __future__ import annotations

import contextlib
import inspect
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import nn

from minigpt.parallel.ring import chunk_bounds

# torch.distributed function -> (kind, its input argument, its output argument)
TRACED_COLLECTIVES = {
    "all_gather": ("all-gather", "tensor", "tensor_list"),  # FSDP1 on a CPU: the output as a list of chunks
    "all_gather_single": ("all-gather", "input_tensor", "output_tensor"),
    "all_gather_into_tensor": ("all-gather", "input_tensor", "output_tensor"),
    "reduce_scatter_single": ("reduce-scatter", "input", "output"),
    "reduce_scatter_tensor": ("reduce-scatter", "input", "output"),
    "all_reduce": ("all-reduce", "tensor", "tensor"),
}
KINDS = ("all-gather", "reduce-scatter", "all-reduce")
FSDP1_WRAPPED = "_fsdp_wrapped_module."  # the prefix FullyShardedDataParallel puts in parameter names


def ring_bytes_sent(kind: str, full_numel: int, element_size: int, world_size: int, rank: int) -> int:
    """Bytes rank ``rank`` sends when a ring runs ``kind`` on a full buffer of ``full_numel``
    elements (chunks as :func:`minigpt.parallel.ring.chunk_bounds` cuts them)."""
    chunks = [stop - start for start, stop in chunk_bounds(full_numel, world_size)]
    reduce_scatter = full_numel - chunks[rank]  # every chunk but its own
    all_gather = full_numel - chunks[(rank + 1) % world_size]  # every chunk but its right neighbour's
    sent = {"all-gather": all_gather, "reduce-scatter": reduce_scatter, "all-reduce": reduce_scatter + all_gather}[kind]
    return sent * element_size


def numel(tensors: torch.Tensor | list[torch.Tensor]) -> int:
    return sum(t.numel() for t in tensors) if isinstance(tensors, (list, tuple)) else tensors.numel()


@dataclass
class Collective:
    """One collective call FSDP made. ``input_numel`` and ``output_numel`` are its raw sizes, beside
    the ring's ``sent_bytes``: FSDP pads each parameter's first dimension to a multiple of N (FSDP2)
    or the unit's flat parameter to a multiple of N (FSDP1), so every rank's shard has the same size,
    and the padding shows as ``output_numel`` larger than the parameters."""

    kind: str
    unit: str
    phase: str
    prefetch: bool
    is_async: bool
    input_numel: int
    output_numel: int
    element_size: int
    sent_bytes: int
    issued: float
    done: float | None = None
    blocked: float = 0.0  # seconds the training thread was blocked on it (exposed)


@dataclass
class StepRecord:
    """What one rank saw during one step: events in the order they happened, and collectives."""

    step: int
    events: list[dict] = field(default_factory=list)
    collectives: list[Collective] = field(default_factory=list)

    def all_gather_order(self) -> list[str]:
        """The units whose all-gather was issued, in issue order (forward, then backward)."""
        return [e["unit"] for e in self.events if e["what"] == "all-gather issued"]

    def schedule(self) -> list[str]:
        """The training thread's order of all-gather and reduce-scatter issues and block
        computation starts, e.g. ``["all-gather root", "all-gather blocks.0", "forward blocks.0", ...]``."""
        names = {
            "all-gather issued": "all-gather",
            "reduce-scatter issued": "reduce-scatter",
            "forward start": "forward",
            "backward start": "backward",
        }
        return [f"{names[e['what']]} {e['unit']}" for e in self.events if e["what"] in names]

    def summary(self) -> dict:
        counts = Counter(c.kind for c in self.collectives)

        def total(bytes_of) -> dict[str, int]:
            return {k: sum(bytes_of(c) for c in self.collectives if c.kind == k) for k in KINDS}

        return {
            "step": self.step,
            "calls": {k: counts[k] for k in KINDS},
            "sent_bytes": total(lambda c: c.sent_bytes),
            "input_bytes": total(lambda c: c.input_numel * c.element_size),
            "output_bytes": total(lambda c: c.output_numel * c.element_size),
            "exposed_s": sum(c.blocked for c in self.collectives),
            "all_gather_order": self.all_gather_order(),
        }


class FSDPTracer:
    """Records one rank's FSDP events while the ``with`` block lasts (see the module docstring).

    ``flavour`` is ``"fsdp2"`` (``fully_shard``: wrappers on ``FSDPParamGroup.unshard``,
    ``wait_for_unshard``, ``post_backward`` and ``_prefetch_unshard``) or ``"fsdp1"``
    (``FullyShardedDataParallel``: wrappers on ``_runtime_utils._unshard``, ``_prefetch_handle``,
    ``_reduce_grad`` and ``_reduce_grad_no_shard``).

    ``blocks`` lists ``(name, inner, outer)`` per transformer block: ``inner`` is the module that
    computes (the ``Block``), ``outer`` the one whose forward hooks run after FSDP registered its
    pre-backward hooks (the block itself for FSDP2, its ``FullyShardedDataParallel`` wrapper for
    FSDP1). Use :meth:`step` around each traced step and :meth:`enter_backward` before
    ``loss.backward()``.
    """

    def __init__(self, model: nn.Module, flavour: str, blocks: list[tuple[str, nn.Module, nn.Module]]):
        if flavour not in ("fsdp2", "fsdp1"):
            raise ValueError(f"flavour must be 'fsdp2' or 'fsdp1', got {flavour!r}")
        self.model, self.flavour, self.blocks = model, flavour, blocks
        self.steps: list[StepRecord] = []
        self._current: StepRecord | None = None
        self._t0 = 0.0
        self._phase = "forward"
        self._units: list[str] = []  # the unit whose FSDP code is running (innermost last)
        self._prefetching = 0
        self._lock = threading.Lock()  # completion callbacks run on the communication thread
        self._in_flight: dict[int, tuple[dist.Work, Collective]] = {}
        self._callbacks: list[torch.futures.Future] = []
        self._undo: list = []  # (object, attribute, original) to put back on exit
        self._handles: list = []  # hook handles to remove on exit
        self._unit_of_handle: dict[int, str] = {}

    # -- the step -------------------------------------------------------------------------------

    def now(self) -> float:
        return time.perf_counter() - self._t0

    @contextlib.contextmanager
    def step(self, index: int):
        self._current = StepRecord(index)
        self._phase = "forward"
        self._t0 = time.perf_counter()
        try:
            yield self._current
        finally:
            for future in self._callbacks:  # every completion callback has run before we read
                future.wait()
            with self._lock:
                self._current.events.sort(key=lambda e: e["t"])  # callbacks may append late
                self.steps.append(self._current)
                self._current = None
            self._callbacks.clear()
            self._in_flight.clear()

    def enter_backward(self) -> None:
        """Call just before ``loss.backward()``: later events belong to the backward pass."""
        self._phase = "backward"
        self._event("loss.backward()", "root")

    def _event(self, what: str, unit: str, t: float | None = None, **detail) -> None:
        record = self._current
        if record is None:
            return
        with self._lock:
            record.events.append(
                {
                    "t": round(self.now() if t is None else t, 7),
                    "what": what,
                    "unit": unit,
                    "phase": self._phase,
                    **detail,
                }
            )

    # -- entering and leaving ---------------------------------------------------------------

    def __enter__(self) -> FSDPTracer:
        try:
            self._install_block_hooks()
            self._install_collective_wrappers()
            if self.flavour == "fsdp2":
                self._install_fsdp2_wrappers()
            else:
                self._install_fsdp1_wrappers()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        for owner, name, original in reversed(self._undo):
            setattr(owner, name, original)
        self._undo.clear()

    def _replace(self, owner, name: str, replacement) -> None:
        self._undo.append((owner, name, owner.__dict__[name] if isinstance(owner, type) else getattr(owner, name)))
        setattr(owner, name, replacement)

    @contextlib.contextmanager
    def _unit(self, name: str):
        self._units.append(name)
        try:
            yield
        finally:
            self._units.pop()

    @contextlib.contextmanager
    def _prefetch(self):
        self._prefetching += 1
        try:
            yield
        finally:
            self._prefetching -= 1

    # -- hooks on the blocks: when each block computes ------------------------------------------

    def _install_block_hooks(self) -> None:
        for name, inner, outer in self.blocks:

            def forward_start(module, args, name=name):
                self._event("forward start", name)

            def forward_end(module, args, output, name=name):
                self._event("forward end", name)

            def mark_backward_start(module, args, output, name=name):
                if self._current is not None and torch.is_grad_enabled() and output.requires_grad:
                    output.register_hook(lambda grad: self._event("backward start", name))

            def backward_end(module, grad_input, grad_output, name=name):
                self._event("backward end", name)

            self._handles += [
                inner.register_forward_pre_hook(forward_start),
                inner.register_forward_hook(forward_end, prepend=True),
                outer.register_forward_hook(mark_backward_start),
                inner.register_full_backward_hook(backward_end),
            ]

    # -- torch.distributed: what is sent ---------------------------------------------------------

    def _install_collective_wrappers(self) -> None:
        for function, (kind, input_arg, output_arg) in TRACED_COLLECTIVES.items():
            self._replace(dist, function, self._traced_collective(getattr(dist, function), kind, input_arg, output_arg))
        work_class = dist.Work
        original_wait = work_class.wait

        def traced_wait(work, *args, **kwargs):
            entry = self._in_flight.pop(id(work), None)
            if entry is None:  # not an asynchronous collective of this step
                return original_wait(work, *args, **kwargs)
            collective = entry[1]
            start = self.now()
            self._event("wait start", collective.unit, t=start, kind=collective.kind)
            try:
                return original_wait(work, *args, **kwargs)
            finally:
                end = self.now()
                collective.blocked += end - start
                self._event("wait end", collective.unit, t=end, kind=collective.kind)

        self._replace(work_class, "wait", traced_wait)

    def _traced_collective(self, original, kind: str, input_arg: str, output_arg: str):
        signature = inspect.signature(original)

        def traced(*args, **kwargs):
            if self._current is None:
                return original(*args, **kwargs)
            call = signature.bind(*args, **kwargs)
            call.apply_defaults()
            inputs, outputs = call.arguments[input_arg], call.arguments[output_arg]
            input_numel, output_numel = numel(inputs), numel(outputs)
            full_numel = max(input_numel, output_numel)  # all-gather: the output; reduce-scatter: the input
            group, is_async = call.arguments["group"], bool(call.arguments["async_op"])
            world_size, rank = dist.get_world_size(group), dist.get_rank(group)
            collective = Collective(
                kind=kind,
                unit=self._units[-1] if self._units else "?",
                phase=self._phase,
                prefetch=self._prefetching > 0,
                is_async=is_async,
                input_numel=input_numel,
                output_numel=output_numel,
                element_size=inputs.element_size(),
                sent_bytes=ring_bytes_sent(kind, full_numel, inputs.element_size(), world_size, rank),
                issued=self.now(),
            )
            self._current.collectives.append(collective)
            self._event(
                f"{kind} issued",
                collective.unit,
                t=collective.issued,
                prefetch=collective.prefetch,
                is_async=is_async,
                input_numel=collective.input_numel,
                output_numel=collective.output_numel,
                sent_bytes=collective.sent_bytes,
            )
            work = original(*args, **kwargs)
            if is_async and work is not None:
                self._in_flight[id(work)] = (work, collective)
                self._callbacks.append(work.get_future().then(lambda _: self._done(collective)))
            else:  # a blocking call: the whole call was exposed
                self._done(collective)
                collective.blocked = collective.done - collective.issued
            return work

        return traced

    def _done(self, collective: Collective) -> None:
        collective.done = self.now()
        self._event(f"{collective.kind} done", collective.unit, t=collective.done)

    # -- FSDP's own methods: which unit, and whether it is a prefetch ----------------------------

    def _install_fsdp2_wrappers(self) -> None:
        from torch.distributed.fsdp._fully_shard._fsdp_param_group import FSDPParamGroup

        def unit_name(group) -> str:
            return group._module_fqn or "root"

        for method in ("unshard", "wait_for_unshard", "post_backward"):
            original = getattr(FSDPParamGroup, method)

            def traced(group, *args, original=original, **kwargs):
                with self._unit(unit_name(group)):
                    return original(group, *args, **kwargs)

            self._replace(FSDPParamGroup, method, traced)
        original_prefetch = FSDPParamGroup._prefetch_unshard  # a staticmethod

        def traced_prefetch(target, pass_type):
            with self._prefetch():
                return original_prefetch(target, pass_type)

        self._replace(FSDPParamGroup, "_prefetch_unshard", staticmethod(traced_prefetch))

    def _install_fsdp1_wrappers(self) -> None:
        from torch.distributed.fsdp import FullyShardedDataParallel, _runtime_utils

        for name, module in self.model.named_modules():
            if isinstance(module, FullyShardedDataParallel) and module._handle is not None:
                self._unit_of_handle[id(module._handle)] = name.replace(FSDP1_WRAPPED, "").rstrip(".") or "root"

        def unit_name(handle) -> str:
            return self._unit_of_handle.get(id(handle), "?")

        for function in ("_unshard", "_reduce_grad", "_reduce_grad_no_shard"):
            original = getattr(_runtime_utils, function)

            def traced(state, handle, *args, original=original, **kwargs):
                with self._unit(unit_name(handle)):
                    return original(state, handle, *args, **kwargs)

            self._replace(_runtime_utils, function, traced)
        original_prefetch = _runtime_utils._prefetch_handle

        def traced_prefetch(state, current_handle, prefetch_mode):
            with self._prefetch():
                return original_prefetch(state, current_handle, prefetch_mode)

        self._replace(_runtime_utils, "_prefetch_handle", traced_prefetch)


def event_log(record: StepRecord, rank: int) -> str:
    """One step of one rank as readable lines, in time order."""
    lines = [f"rank {rank}, step {record.step} (ms since the step started)"]
    for e in record.events:
        extra = [e["kind"]] if "kind" in e else []
        if e.get("prefetch"):
            extra.append("prefetch")
        if e.get("is_async"):
            extra.append("async")
        if "sent_bytes" in e:
            extra.append(f"in {e['input_numel']} -> out {e['output_numel']} elements, sends {e['sent_bytes']} B")
        lines.append(f"{1000 * e['t']:9.3f}  {e['phase']:8}  {e['what']:22} {e['unit']:9} {', '.join(extra)}".rstrip())
    return "\n".join(lines) + "\n"
