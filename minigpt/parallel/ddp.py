"""A hand-rolled, bucketed, overlapped DDP: what ``torch.nn.parallel.DistributedDataParallel``
does, in one readable file.

Every rank holds a full copy of the model and trains on its own slice of the global batch.
After backward, the gradients must be averaged over the ranks so that every copy takes the same
optimizer step. Doing it parameter by parameter after backward (the naive way) wastes time: the
network idles during backward and the CPU/GPU idles during communication. So:

1. **Buckets.** Parameters are grouped, in *reverse* registration order (roughly the order in
   which backward produces their gradients), into buckets of about ``bucket_cap_mb``
   (:func:`assign_buckets`). One all-reduce per bucket: few large messages instead of many
   small ones. A bucket is closed once it *reaches* the cap, as PyTorch's DDP does, so a small
   tensor (a bias) travels with the large one after it instead of in a message of its own.
2. **Hooks.** ``Tensor.register_post_accumulate_grad_hook`` calls :meth:`_on_grad_ready` with the
   *parameter* (not the gradient) once its ``.grad`` is final for this backward. The hook only
   keeps count: it marks the parameter ready in its bucket. It runs once per parameter, from
   Python, and a Python call costs microseconds whatever the tensor's size: a model of 400 small
   tensors pays it 400 times a step, so the hook does as little as it can.
3. **Overlap.** When a bucket's last gradient is in, :meth:`_launch` moves the bucket's gradients
   into its flat buffer *in one call* (``torch._foreach_copy_``, the call ``torch.optim``'s
   foreach optimizers use: one trip into C++ for the whole bucket instead of one per
   parameter), divides the buffer by the world size, and starts an *asynchronous* all-reduce of
   it while backward goes on computing earlier layers' gradients. Buckets are launched in index
   order on every rank, whatever order their gradients arrive in: collectives are matched by
   order, so two ranks launching different buckets first would sum unrelated data.
4. **Finish.** An autograd-engine callback, queued by the first hook of a backward pass, runs
   :meth:`finish_gradient_synchronization` when backward ends: it waits for every bucket and
   makes each parameter's ``.grad`` a *view* of its slot, where the average now is (PyTorch's
   ``gradient_as_bucket_view=True``): no copy back, and the gradients cost no memory besides
   the buckets. So when ``loss.backward()`` returns the gradients are synchronised, exactly as
   with PyTorch's DDP.

``no_sync()`` skips the all-reduce for gradient accumulation; the decision is taken in
``forward`` (the backward of a forward run inside ``no_sync`` never synchronises), as in PyTorch.
With ``collective="ring"`` the buckets are reduced by :func:`minigpt.parallel.ring.ring_all_reduce`
on a background thread instead of ``torch.distributed.all_reduce``.

Lab 01's page measures what each of the three choices (buckets closed at the cap, one call per
bucket, gradients as views) buys against PyTorch's DDP (:mod:`minigpt.parallel.ddp_steps`).
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import nn

from minigpt.parallel import ring

COLLECTIVES = ("torch", "ring")


def named_trainable_parameters(module: nn.Module) -> list[tuple[str, nn.Parameter]]:
    """``module``'s parameters that need a gradient synchronised, in registration order, each once:
    ``(name, parameter)``, where a parameter shared by two modules (tied weights) is named by all
    its names joined with " = " (e.g. ``"wte.weight = lm_head.weight"``)."""
    names: dict[int, list[str]] = {}
    params: list[nn.Parameter] = []
    for name, p in module.named_parameters(remove_duplicate=False):
        if not p.requires_grad:
            continue
        if id(p) not in names:
            names[id(p)] = []
            params.append(p)
        names[id(p)].append(name)
    return [(" = ".join(names[id(p)]), p) for p in params]


def assign_buckets(module: nn.Module, bucket_cap_bytes: int) -> list[list[tuple[str, nn.Parameter]]]:
    """Group ``module``'s trainable parameters into buckets: a list of buckets, each a list of
    ``(name, parameter)``.

    * Only parameters with ``requires_grad`` take part (a frozen one has no gradient to sync).
    * A parameter shared by two modules (tied weights) appears once, named by all its names
      joined with " = " (e.g. ``"wte.weight = lm_head.weight"``): it has one ``.grad``.
    * Buckets are filled in *reverse* registration order (bucket 0 starts with the last
      parameter); a bucket is closed as soon as its size reaches ``bucket_cap_bytes``, so it may
      pass the cap by its last parameter, and a parameter larger than the cap closes the bucket
      it joins. A bucket holds one dtype on one device (one flat buffer): a parameter of another
      dtype or device starts a new bucket.
    """
    buckets: list[list[tuple[str, nn.Parameter]]] = []
    current: list[tuple[str, nn.Parameter]] = []
    current_bytes = 0
    for name, p in reversed(named_trainable_parameters(module)):
        if current and (p.dtype, p.device) != (current[0][1].dtype, current[0][1].device):
            buckets.append(current)
            current, current_bytes = [], 0
        current.append((name, p))
        current_bytes += p.numel() * p.element_size()
        if current_bytes >= bucket_cap_bytes:
            buckets.append(current)
            current, current_bytes = [], 0
    if current:
        buckets.append(current)
    return buckets


@dataclass
class Bucket:
    """One flat buffer, the parameters whose gradients it carries, and its timings."""

    index: int
    params: list[nn.Parameter]
    names: list[str]
    slices: list[tuple[int, int]]  # where each parameter's gradient sits in ``buffer``
    buffer: torch.Tensor
    views: list[torch.Tensor]  # each parameter's slot: a view of ``buffer`` shaped like the parameter
    ready: set[int] = field(default_factory=set)  # id() of parameters whose gradient is ready
    handle: object = None  # the asynchronous all-reduce in flight, or None
    first_ready_s: float | None = None  # times in seconds since the forward pass started
    last_ready_s: float | None = None
    launched_s: float | None = None
    done_s: float | None = None

    @property
    def nbytes(self) -> int:
        return self.buffer.numel() * self.buffer.element_size()

    def is_full(self) -> bool:
        return len(self.ready) == len(self.params)

    def reset(self) -> None:
        self.ready.clear()
        self.handle = None
        self.first_ready_s = self.last_ready_s = self.launched_s = self.done_s = None


class _Pending:
    """A uniform ``wait()`` over a ``torch.distributed`` Work or a thread's Future."""

    def __init__(self, work=None, future=None):
        self.work, self.future = work, future

    def wait(self) -> None:
        if self.work is not None:
            self.work.wait()
        else:
            self.future.result()


class BucketedDDP(nn.Module):
    """Wrap ``module`` for data-parallel training over ``process_group`` (default: all ranks).

    ``ddp(x)`` runs ``ddp.module(x)``; after ``loss.backward()`` every parameter's ``.grad`` holds
    the average over the ranks, as a view of its bucket's buffer (so a ``.grad`` kept from one step
    to the next changes with the bucket: clone it to keep it). ``bucket_cap_mb`` is in MiB, as in
    PyTorch's DDP.
    """

    def __init__(
        self,
        module: nn.Module,
        bucket_cap_mb: float = 25.0,
        process_group: dist.ProcessGroup | None = None,
        collective: str = "torch",
    ):
        super().__init__()
        if not bucket_cap_mb > 0:
            raise ValueError(f"bucket_cap_mb must be a positive number of MiB, got {bucket_cap_mb}")
        if collective not in COLLECTIVES:
            raise ValueError(f"collective {collective!r} is not known; use one of {', '.join(COLLECTIVES)}")
        self.module = module
        self.process_group = process_group
        self.collective = collective
        self.world_size = dist.get_world_size(process_group)
        self.bucket_cap_bytes = int(bucket_cap_mb * 2**20)
        self._broadcast_from_rank0()

        self.buckets: list[Bucket] = []
        self._bucket_of: dict[int, int] = {}  # id(parameter) -> bucket index
        self._slots: dict[int, torch.Tensor] = {}  # id(parameter) -> its slot: a view of the bucket's buffer
        params = []
        for b, members in enumerate(self.assign_buckets(module, self.bucket_cap_bytes)):
            slices, start = [], 0
            for _, p in members:
                slices.append((start, start + p.numel()))
                start += p.numel()
                self._bucket_of[id(p)] = b
                params.append(p)
            first = members[0][1]
            buffer = torch.zeros(start, dtype=first.dtype, device=first.device)
            views = [buffer[a:z].view_as(p) for (_, p), (a, z) in zip(members, slices)]
            self.buckets.append(Bucket(b, [p for _, p in members], [n for n, _ in members], slices, buffer, views))
            for (_, p), view in zip(members, views):
                self._slots[id(p)] = view
        for p in params:
            p.register_post_accumulate_grad_hook(self._on_grad_ready)

        self._sync_enabled = True  # switched off by no_sync()
        self._sync_this_backward = True  # decided by forward()
        self._backward_started = False
        self._next_bucket = 0  # the next bucket to launch: launches go in index order
        self._t0 = time.perf_counter()
        self._ring_thread = ThreadPoolExecutor(1, thread_name_prefix="ring") if collective == "ring" else None
        self.steps_synchronised = 0
        self.bytes_all_reduced = 0  # in the last synchronised backward
        self.ring_bytes = ring.ByteCounter()  # what the ring collectives sent (collective="ring")

    assign_buckets = staticmethod(assign_buckets)

    def _broadcast_from_rank0(self) -> None:
        """Every rank starts from rank 0's parameters and buffers."""
        src = dist.get_global_rank(self.process_group, 0) if self.process_group is not None else 0
        with torch.no_grad():
            for tensor in [*self.module.parameters(), *self.module.buffers()]:
                dist.broadcast(tensor, src=src, group=self.process_group)

    # ------------------------------------------------------------------------------------------
    # forward and the switch for gradient accumulation

    def forward(self, *args, **kwargs):
        self._sync_this_backward = self._sync_enabled
        self._t0 = time.perf_counter()
        return self.module(*args, **kwargs)

    @contextmanager
    def no_sync(self):
        """Inside this block, forward passes build graphs whose backward only accumulates
        ``.grad`` locally; the next backward outside it all-reduces the accumulated sum."""
        previous, self._sync_enabled = self._sync_enabled, False
        try:
            yield
        finally:
            self._sync_enabled = previous

    # ------------------------------------------------------------------------------------------
    # backward: hooks, launches, the end

    def _now(self) -> float:
        return time.perf_counter() - self._t0

    def _slot(self, param: nn.Parameter) -> torch.Tensor:
        """``param``'s place in its bucket's buffer, shaped like the parameter (a view, made once)."""
        return self._slots[id(param)]

    def _on_grad_ready(self, param: nn.Parameter) -> None:
        """The hook: ``param.grad`` is final for this backward. Mark it ready in its bucket, and
        launch every bucket that is now complete and whose predecessors have all been launched."""
        if not self._sync_this_backward:
            return
        if not self._backward_started:
            self._backward_started = True
            self._next_bucket = 0
            for bucket in self.buckets:
                bucket.reset()
            torch.autograd.Variable._execution_engine.queue_callback(self.finish_gradient_synchronization)
        bucket = self.buckets[self._bucket_of[id(param)]]
        bucket.ready.add(id(param))
        if bucket.first_ready_s is None:
            bucket.first_ready_s = self._now()
        if bucket.is_full():
            bucket.last_ready_s = self._now()
            while self._next_bucket < len(self.buckets) and self.buckets[self._next_bucket].is_full():
                self._launch(self.buckets[self._next_bucket])
                self._next_bucket += 1

    def _launch(self, bucket: Bucket) -> None:
        """Put the bucket's gradients, divided by the world size, into its buffer, and start an
        asynchronous sum of the buffer over the ranks without waiting for it."""
        bucket.launched_s = self._now()
        # one call for the whole bucket; a gradient that already *is* its slot (a view kept from
        # the last step) is copied onto itself, which changes nothing
        torch._foreach_copy_(bucket.views, [p.grad for p in bucket.params])
        bucket.buffer.div_(self.world_size)
        self._start_all_reduce(bucket)

    def _start_all_reduce(self, bucket: Bucket) -> None:
        """The asynchronous sum of ``bucket.buffer`` over the ranks: its handle goes in
        ``bucket.handle``, and ``bucket.done_s`` is set when it completes."""

        def done(*_):
            bucket.done_s = self._now()

        if self._ring_thread is not None:

            def reduce() -> None:
                ring.ring_all_reduce(bucket.buffer, "sum", self.process_group, self.ring_bytes)
                done()

            bucket.handle = _Pending(future=self._ring_thread.submit(reduce))
        else:
            work = dist.all_reduce(bucket.buffer, group=self.process_group, async_op=True)
            work.get_future().then(done)
            bucket.handle = _Pending(work=work)

    def finish_gradient_synchronization(self) -> None:
        """Wait for every bucket's all-reduce and make each parameter's ``.grad`` a view of its
        slot, where the average is (no copy back).

        Runs by itself at the end of backward; calling it again (or with nothing in flight)
        does nothing. A parameter that got no gradient is an error that names it: its bucket was
        never launched, and waiting for it would hang every rank.
        """
        if not self._backward_started:
            return
        self._backward_started = False
        unlaunched = self.buckets[self._next_bucket :]
        if unlaunched:
            missing = [name for b in unlaunched for p, name in zip(b.params, b.names) if id(p) not in b.ready]
            for bucket in self.buckets[: self._next_bucket]:
                bucket.handle.wait()  # leave no collective half-done before raising
            raise RuntimeError(
                f"rank {dist.get_rank()}: BucketedDDP: these parameters received no gradient in this "
                f"backward pass, so their buckets were never all-reduced: {', '.join(missing)}. "
                "Use them in the loss on every rank, or set requires_grad=False before wrapping."
            )
        for bucket in self.buckets:
            bucket.handle.wait()
            bucket.done_s = bucket.done_s or self._now()
            self._bucket_into_gradients(bucket)
            bucket.handle = None
        self.bytes_all_reduced = sum(b.nbytes for b in self.buckets)
        self.steps_synchronised += 1

    def _bucket_into_gradients(self, bucket: Bucket) -> None:
        """The averages become the gradients: each parameter's ``.grad`` is made a view of its
        slot (PyTorch's ``gradient_as_bucket_view=True``), so nothing is copied back."""
        for p, view in zip(bucket.params, bucket.views):
            p.grad = view

    # ------------------------------------------------------------------------------------------
    # introspection

    def bucket_layout(self) -> list[dict]:
        """Which parameter sits in which bucket: ``[{"bucket", "params", "numel", "bytes"}]``."""
        return [
            {"bucket": b.index, "params": list(b.names), "numel": b.buffer.numel(), "bytes": b.nbytes}
            for b in self.buckets
        ]

    def last_timeline(self) -> list[dict]:
        """Per bucket, in seconds since the last forward started: first and last gradient ready,
        all-reduce launched, all-reduce done."""
        return [
            {
                "bucket": b.index,
                "bytes": b.nbytes,
                "first_ready_s": b.first_ready_s,
                "last_ready_s": b.last_ready_s,
                "launched_s": b.launched_s,
                "done_s": b.done_s,
            }
            for b in self.buckets
        ]


def uneven_loss_scale(rows_here: int, rows_total: int, world_size: int) -> float:
    """What a rank multiplies its loss by when the ranks hold different numbers of sentences, so that
    DDP's average of the ranks' gradients is the gradient of the whole batch: ``N * B_r / B``. The
    loss of a slice is the mean over its ``B_r`` sentences; the mean of the ranks' means would weigh a
    sentence of a small slice more than one of a large slice."""
    if not 0 <= rows_here <= rows_total or rows_total < 1 or world_size < 1:
        raise ValueError(f"{rows_here} of {rows_total} rows on {world_size} ranks: need 0 <= rows <= total, both >= 1")
    return world_size * rows_here / rows_total


def uneven_slices(splits: tuple[tuple[int, ...], ...] = ((32, 32), (40, 24), (60, 4))) -> list[dict]:
    """For each split of MiniGPT's 64-sentence batch over ranks: the largest difference from the whole
    batch's gradient, relative to its largest element, of the plain average of the ranks' gradients
    and of the average with each loss scaled by :func:`uneven_loss_scale` (each slice's gradient taken
    in one process: the arithmetic DDP's all-reduce does)."""
    from minigpt import grammar
    from minigpt.train import TrainConfig, build_model

    cfg = TrainConfig()
    model = build_model(cfg)
    x, y, mask = grammar.get_batch("train", 0, cfg.batch_size, seed=cfg.seed, block_size=cfg.block_size)

    def gradient(rows: slice, scale: float = 1.0) -> torch.Tensor:
        model.zero_grad()
        (model(x[rows], y[rows], mask[rows])[1] * scale).backward()
        return torch.cat([p.grad.flatten() for p in model.parameters()])

    whole = gradient(slice(0, cfg.batch_size))
    found = []
    for split in splits:
        if sum(split) != cfg.batch_size:
            raise ValueError(f"the split {split} does not add up to the batch of {cfg.batch_size}")
        bounds = [sum(split[:r]) for r in range(len(split) + 1)]
        parts = [slice(bounds[r], bounds[r + 1]) for r in range(len(split))]
        n = len(split)
        plain = sum(gradient(part) for part in parts) / n
        scaled = sum(gradient(part, uneven_loss_scale(b, cfg.batch_size, n)) for part, b in zip(parts, split)) / n
        scale = whole.abs().max()
        found.append(
            {
                "split": list(split),
                "plain": float((plain - whole).abs().max() / scale),
                "scaled": float((scaled - whole).abs().max() / scale),
            }
        )
    return found
