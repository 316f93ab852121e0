"""Measuring memory per rank, on a CPU as on a GPU: a census of model states, and a peak.

A GPU run asks the CUDA caching allocator: ``torch.cuda.max_memory_allocated()`` is the peak of
all tensor bytes since ``torch.cuda.reset_peak_memory_stats()``. A CPU has no such counter, so
this file gives two measurements that work on both, and says exactly what each one counts.

1. **The census** (:func:`model_state_bytes`): at one moment, the bytes of the tensors that make
   up the model states of this rank, by kind:

   * ``parameters`` - what the module holds as parameters. For a sharded parameter (a DTensor,
     as FSDP2 makes them) that is the local shard, padding included (FSDP2 keeps each shard in a
     buffer padded to the same length on every rank);
   * ``gradients``  - the ``.grad`` of those parameters (for FSDP2: sharded gradients);
   * ``optimizer``  - every tensor in ``optimizer.state`` (AdamW's two moments, its step count);
   * ``gathered``   - FSDP2's all-gather buffers that are alive at this moment: the unsharded
     parameters a unit uses between its all-gather and its reshard (:func:`fsdp_tensors` reads
     them from FSDP2's ``FSDPParam.all_gather_outputs``; a freed one has 0 bytes);
   * ``extra``      - any other tensors the caller passes (e.g. a ZeRO-1 optimizer's buffers).

   Bytes are counted per *storage*, once: a view of a tensor counted already adds nothing, and
   a storage FSDP freed (resized to zero) adds nothing. Activations are not model states: the
   census does not see them.

2. **The peak** (:class:`PeakMemory`): over a region of code, the largest number of bytes held
   at one moment by tensors *allocated inside the region*: activations, all-gather buffers,
   gradients, optimizer states created there, the temporaries of every op. It does not count
   tensors alive before the region (a census does); how it is measured on a CPU and on CUDA, and
   what each method misses: :class:`PeakMemory`. Neither measurement counts memory that is not a
   torch tensor (Python objects, gloo's own buffers, the allocator's cache).

The two are used together: a census at each phase boundary (after init, forward, backward,
optimizer step) says what is *kept*; the peak inside each phase says what the phase *needed*.
Nothing here depends on FSDP except :func:`fsdp_tensors`, which finds nothing in a module
without FSDP units, so the same functions measure DDP or a ZeRO-1 optimizer.
"""

from __future__ import annotations

import bisect
import contextlib
import os
import sys
from collections.abc import Iterable, Iterator

import torch

CENSUS_KINDS = ("parameters", "gradients", "optimizer", "gathered", "extra")
_PHASE_PREFIX = "peak-memory:"  # the profiler range that marks a phase


def local_tensor(t: torch.Tensor) -> torch.Tensor:
    """The tensor this rank holds: the local shard of a DTensor, the tensor itself otherwise."""
    to_local = getattr(t, "to_local", None)
    return to_local() if callable(to_local) else t


def _storage_key_and_bytes(t: torch.Tensor) -> tuple[tuple, int]:
    storage = t.untyped_storage()
    return (t.device.type, t.device.index, storage.data_ptr()), storage.nbytes()


def fsdp_tensors(model: torch.nn.Module) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """FSDP2's sharded parameters and its all-gather buffers, over every unit in ``model``
    (two empty lists for a module without FSDP units).

    Each ``FSDPParam`` keeps ``sharded_param`` (this rank's shard, a DTensor over a padded
    buffer) and ``all_gather_outputs`` (the buffer its all-gather writes into, of which the
    unsharded parameter is a view). Between a unit's all-gather and its reshard, the module's
    parameters *are* the unsharded views; FSDP2 frees the buffer (resizes its storage to 0
    bytes) when the unit reshards and allocates it again at the next all-gather.
    """
    sharded, gathered = [], []
    for module in model.modules():
        get_state = getattr(module, "_get_fsdp_state", None)
        if get_state is None:
            continue
        for group in getattr(get_state(), "_fsdp_param_groups", []):
            for fsdp_param in group.fsdp_params:
                sharded.append(local_tensor(fsdp_param.sharded_param))
                gathered.extend(fsdp_param.all_gather_outputs)
    return sharded, gathered


def model_state_bytes(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None, extra: Iterable[torch.Tensor] = ()
) -> dict[str, int]:
    """The census: bytes of this rank's model states right now, by kind, and their ``total``.

    Each storage is counted once. FSDP's gathered buffers are claimed first, so that while a
    unit is unsharded its parameters count as ``gathered`` and its shards as ``parameters``.
    """
    sharded, gathered = fsdp_tensors(model)
    kinds: dict[str, list[torch.Tensor]] = {
        "gathered": gathered,
        "parameters": sharded + [local_tensor(p) for p in model.parameters()],
        "gradients": [local_tensor(p.grad) for p in model.parameters() if p.grad is not None],
        "optimizer": [
            local_tensor(v)
            for state in (optimizer.state.values() if optimizer else [])
            for v in state.values()
            if isinstance(v, torch.Tensor)
        ],
        "extra": [local_tensor(t) for t in extra],
    }
    seen: set[tuple] = set()
    counts = {}
    for kind, tensors in kinds.items():
        total = 0
        for t in tensors:
            key, nbytes = _storage_key_and_bytes(t)
            if nbytes == 0 or key in seen:
                continue
            seen.add(key)
            total += nbytes
        counts[kind] = total
    counts = {kind: counts[kind] for kind in CENSUS_KINDS}
    counts["total"] = sum(counts.values())
    return counts


class PeakMemory:
    """The peak of tensor bytes allocated inside a region, overall and per named phase.

        with PeakMemory() as mem:
            with mem.phase("forward"):
                loss = model(x)
            with mem.phase("backward"):
                loss.backward()
        mem.peak_bytes            # the peak over the whole region
        mem.phase_peaks["forward"]  # the peak while "forward" ran

    Every figure is measured from the same zero, the start of the region: a phase's peak
    includes what earlier phases allocated and still hold. ``end_bytes`` is what the region
    left allocated. Neither method counts tensors alive before the region.

    * CPU: the running sum, in time order, of the allocations (+) and frees (-) that
      ``torch.profiler`` records with ``profile_memory=True``, each with its address; a free counts
      only when its address was allocated inside the region (torch may also warn, once, "Memory
      block of unknown size was allocated before the profiling started": such frees are not
      counted either). The profiler sees the thread that entered the region (a CPU backward runs
      on that thread too), not others: a tensor gloo's worker threads allocate is missed.
    * CUDA: ``max_memory_allocated()`` minus ``memory_allocated()`` at the start, which also
      subtracts frees of older tensors: the two agree when the region frees none of those.
    """

    def __init__(self, device: torch.device | str = "cpu"):
        self.device = torch.device(device)
        self.peak_bytes = 0
        self.end_bytes = 0
        self.phase_peaks: dict[str, int] = {}
        self._phase_order: list[str] = []
        self._profiler = None
        self._cuda_start = 0

    # -- the region
    def __enter__(self) -> PeakMemory:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self._cuda_start = torch.cuda.memory_allocated(self.device)
        else:
            from torch.profiler import ProfilerActivity, profile

            self._profiler = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
            with _stderr_silenced():  # kineto writes a "profiler_start" line on stderr
                self._profiler.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self.peak_bytes = max(self.peak_bytes, torch.cuda.max_memory_allocated(self.device) - self._cuda_start)
            self.end_bytes = torch.cuda.memory_allocated(self.device) - self._cuda_start
            return
        with _stderr_silenced():
            self._profiler.__exit__(*exc)
        if exc[0] is None:
            self._read_profile()

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """A named part of the region; its peak lands in ``phase_peaks[name]``."""
        if name in self.phase_peaks or name in self._phase_order:
            raise ValueError(f"phase {name!r} was measured already in this region")
        self._phase_order.append(name)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self.peak_bytes = max(self.peak_bytes, torch.cuda.max_memory_allocated(self.device) - self._cuda_start)
            torch.cuda.reset_peak_memory_stats(self.device)
            yield
            torch.cuda.synchronize(self.device)
            self.phase_peaks[name] = torch.cuda.max_memory_allocated(self.device) - self._cuda_start
            return
        from torch.profiler import record_function

        with record_function(_PHASE_PREFIX + name):
            yield

    def _read_profile(self) -> None:
        """Walk the profiler's event tree: every allocation (+size) and free (-size) with its
        address, and the time window of each phase. In time order, an allocation adds its bytes
        and a free subtracts them only if that address was allocated inside the region; the
        running sum is the bytes held after each event. A phase's peak is the largest running
        sum inside its window, or what was held when it began if that is larger."""
        events, windows = [], {}
        pending = list(self._profiler.profiler.kineto_results.experimental_event_tree())
        while pending:
            event = pending.pop()
            pending.extend(event.children)
            if event.name.startswith(_PHASE_PREFIX):
                windows[event.name[len(_PHASE_PREFIX) :]] = (event.start_time_ns, event.end_time_ns)
            elif str(event.tag).endswith("Allocation") and event.extra_fields.device.type == "cpu":
                events.append((event.start_time_ns, event.extra_fields.alloc_size, event.extra_fields.ptr))
        live: dict[int, int] = {}  # address -> bytes, for what the region allocated
        times, held, running = [], [], 0
        for t, size, ptr in sorted(events):  # at equal times a free (negative) comes first
            if size > 0:
                live[ptr] = size
                running += size
            elif ptr in live:
                running -= live.pop(ptr)
            times.append(t)
            held.append(running)
        self.peak_bytes, self.end_bytes = max(held, default=0), running
        for name in self._phase_order:
            start, end = windows[name]
            first = bisect.bisect_left(times, start)
            last = bisect.bisect_right(times, end)
            at_start = held[first - 1] if first > 0 else 0
            self.phase_peaks[name] = max([at_start, *held[first:last]])


@contextlib.contextmanager
def _stderr_silenced() -> Iterator[None]:
    """Send file descriptor 2 to /dev/null for a moment (C++ code writes there directly)."""
    sys.stderr.flush()
    saved, null = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(null)


def loss_peaks(chunks: tuple[int, ...] = (1, 4, 16), batch: int = 64, seed: int = 0) -> list[dict]:
    """The peak bytes of the loss's forward and backward passes on MiniGPT's head (``batch`` sentences of
    ``block_size`` tokens, vocabulary and width of :class:`~minigpt.model.GPTConfig`), whole
    (``chunks=1``) and in ``chunks`` equal chunks of sentences, each with the loss's and the
    gradients' largest differences from the whole computation."""
    from minigpt.logits import chunked_masked_loss
    from minigpt.model import GPTConfig, masked_loss

    cfg = GPTConfig()
    generator = torch.Generator().manual_seed(seed)
    hidden0 = torch.randn(batch, cfg.block_size, cfg.n_embd, generator=generator)
    weight0 = torch.randn(cfg.vocab_size, cfg.n_embd, generator=generator) * 0.02
    targets = torch.randint(0, cfg.vocab_size, (batch, cfg.block_size), generator=generator)
    mask = torch.rand(batch, cfg.block_size, generator=generator) < 0.5
    rows = []
    whole = None
    for n in chunks:
        hidden, weight = hidden0.clone().requires_grad_(), weight0.clone().requires_grad_()
        with PeakMemory() as mem:
            if n == 1:
                loss = masked_loss(hidden @ weight.T, targets, mask)
            else:
                loss = chunked_masked_loss(hidden, weight, targets, mask, batch // n)
            loss.backward()
        found = (loss.detach(), hidden.grad, weight.grad)
        whole = whole or found
        rows.append(
            {
                "chunks": n,
                "peak_bytes": mem.peak_bytes,
                "loss_diff": float((found[0] - whole[0]).abs()),
                "grad_diff": max(float((a - b).abs().max()) for a, b in zip(found[1:], whole[1:], strict=True)),
            }
        )
    return rows
