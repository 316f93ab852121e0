"""N virtual workers train the numpy MLP with Adam under DDP and ZeRO-1/2/3, for real.

Every worker is a :class:`Worker`: a ledger of the arrays it holds (by name and kind: weights,
gradients, optimizer state, working buffers, activations), so its memory is *measured* from what
it really holds at each moment, not computed. The workers talk only through the ring
collectives of :class:`Cluster`, which move real chunks of real arrays from each worker to its
right neighbour, in the same order as Lab 01's ``minigpt/parallel/ring.py``, and count the bytes each
worker sends.

Layout. Each unit (a layer: W and b, flattened) is padded to a multiple of N and cut into N equal
chunks; worker r owns chunk r of every unit (FSDP2 shards each parameter the same way). The four
steps (:data:`STAGE_STEPS`):

* stage 0, DDP: whole weights, gradients and optimizer everywhere; each unit's gradient is
  all-reduced as soon as backward has produced it; every worker updates everything;
* stage 1: the optimizer state of chunk r only; gradients reduce-scattered (worker r ends with the
  sum of chunk r), chunk r updated, weights all-gathered;
* stage 2: as stage 1, but the whole gradient of a unit lives only until its reduce-scatter; the
  worker keeps the chunk it owns (a learner writes this one: ``lab/exercises/lab02_zero.py``);
* stage 3: weights sharded too: a unit is all-gathered just before its forward, freed after,
  all-gathered again for its backward; nothing is gathered after the update.

The loss of a worker is its rows' share of the global batch's loss, so the gradients are
*summed* over workers. Every stage does the same float32 arithmetic in the same order, so every
stage ends with bit-identical weights (``tests/test_lab02_sim.py`` checks it).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from minigpt.zero import mlp
from minigpt.zero.memory import recipe

KINDS = ("weights", "gradients", "optimizer", "working", "activations")
MODEL_STATE = ("weights", "gradients", "optimizer", "working")
DTYPES = {2: np.float16, 4: np.float32}


@dataclass
class Event:
    """One moment of a step on one worker: what just happened and what it holds now."""

    label: str
    collective: str | None
    held: dict[str, int]  # bytes by kind

    @property
    def model_state(self) -> int:
        return sum(self.held[k] for k in MODEL_STATE)


class Worker:
    """One virtual device: the arrays it holds, its peaks, its byte counter and its timeline."""

    def __init__(self, rank: int):
        self.rank = rank
        self.arrays: dict[str, tuple[str, np.ndarray]] = {}
        self.peak_model_state = 0
        self.peak_activations = 0
        self.sent = 0
        self.timeline: list[Event] = []

    def hold(self, name: str, kind: str, array: np.ndarray) -> np.ndarray:
        if kind not in KINDS:
            raise ValueError(f"unknown kind {kind!r}; one of {KINDS}")
        self.arrays[name] = (kind, array)
        self._update_peaks()
        return array

    def get(self, name: str) -> np.ndarray:
        return self.arrays[name][1]

    def drop(self, name: str) -> None:
        del self.arrays[name]

    def held(self) -> dict[str, int]:
        out = dict.fromkeys(KINDS, 0)
        for kind, array in self.arrays.values():
            out[kind] += array.nbytes
        return out

    def _update_peaks(self) -> None:
        held = self.held()
        self.peak_model_state = max(self.peak_model_state, sum(held[k] for k in MODEL_STATE))
        self.peak_activations = max(self.peak_activations, held["activations"])


class Cluster:
    """N workers, the model's layout, the optimizer's settings, and the ring collectives."""

    def __init__(
        self,
        n_workers: int,
        spec: mlp.MLPSpec,
        recipe_name: str = "fp32",
        lr: float = 1e-2,
        betas: tuple[float, float] = (0.9, 0.95),
        eps: float = 1e-8,
    ):
        if not isinstance(n_workers, int) or n_workers < 1:
            raise ValueError(f"n_workers must be a positive integer, got {n_workers!r}")
        self.n = n_workers
        self.spec = spec
        self.recipe = recipe(recipe_name)
        if self.recipe.grad_bytes != self.recipe.reduce_bytes:
            raise ValueError(f"the simulator keeps one gradient buffer; recipe {recipe_name!r} has two")
        self.param_dtype = DTYPES[self.recipe.param_bytes]
        self.grad_dtype = DTYPES[self.recipe.grad_bytes]
        self.master = self.recipe.optimizer_bytes == 12  # an fp32 copy beside 16-bit weights
        self.lr, self.betas, self.eps = lr, betas, eps
        self.workers = [Worker(r) for r in range(n_workers)]
        self.padded = [self.n * -(-size // self.n) for size in spec.unit_sizes]

    # --- layout --------------------------------------------------------------------------------
    def chunk(self, unit: int, rank: int) -> slice:
        """Worker ``rank``'s chunk of unit ``unit`` (padded length / N elements)."""
        length = self.padded[unit] // self.n
        return slice(rank * length, (rank + 1) * length)

    @property
    def units(self) -> range:
        return range(len(self.padded))

    # --- the ring ------------------------------------------------------------------------------
    def _exchange(
        self,
        buffers: list[np.ndarray],
        send_chunk: Callable[[int], int],
        combine: Callable[[np.ndarray, np.ndarray], None],
        unit: int,
    ) -> None:
        """Every worker sends one chunk to its right neighbour, at the same time."""
        outgoing = [buffers[r][self.chunk(unit, send_chunk(r) % self.n)].copy() for r in range(self.n)]
        for r in range(self.n):
            self.workers[r].sent += outgoing[r].nbytes
            left = (r - 1) % self.n
            combine(buffers[r][self.chunk(unit, send_chunk(left) % self.n)], outgoing[left])

    def reduce_scatter(self, buffers: list[np.ndarray], unit: int) -> None:
        """Ring reduce-scatter of unit ``unit``'s buffers, in place: afterwards worker r's chunk r
        holds the sum over the workers (the other chunks hold partial sums)."""
        for step in range(self.n - 1):
            self._exchange(buffers, lambda r, step=step: r - step - 1, np.ndarray.__iadd__, unit)

    def all_gather(self, buffers: list[np.ndarray], unit: int) -> None:
        """Ring all-gather: worker r brings chunk r; afterwards every worker has every chunk."""

        def store(dst: np.ndarray, src: np.ndarray) -> None:
            dst[...] = src

        for step in range(self.n - 1):
            self._exchange(buffers, lambda r, step=step: r - step, store, unit)

    def all_reduce(self, buffers: list[np.ndarray], unit: int) -> None:
        self.reduce_scatter(buffers, unit)
        self.all_gather(buffers, unit)

    def record(self, label: str, collective: str | None = None) -> None:
        for w in self.workers:
            w.timeline.append(Event(label, collective, w.held()))

    # --- compute -------------------------------------------------------------------------------
    def forward_unit(self, w: Worker, unit: int, weights: np.ndarray) -> None:
        """Run unit ``unit`` on worker ``w`` with the whole (gathered) ``weights``; keeps its
        input and output as activations for backward."""
        fan_in, fan_out = self.spec.shapes[unit]
        x = w.get(f"act{unit}")
        last = unit == len(self.padded) - 1
        w.hold(f"act{unit + 1}", "activations", mlp.forward_unit(x, weights, fan_in, fan_out, last))

    def backward_unit(self, w: Worker, unit: int, weights: np.ndarray) -> np.ndarray:
        """Backward through unit ``unit`` (dL/d output held as ``dout``); returns the unit's whole
        padded gradient in the gradient dtype (not yet held: the caller decides its kind) and
        leaves dL/d input as the new ``dout``. Frees the unit's output activation."""
        fan_in, fan_out = self.spec.shapes[unit]
        last = unit == len(self.padded) - 1
        dx, grad = mlp.backward_unit(
            w.get("dout"), w.get(f"act{unit}"), w.get(f"act{unit + 1}"), weights, fan_in, fan_out, last
        )
        w.drop(f"act{unit + 1}")
        w.hold("dout", "activations", dx)
        full = np.zeros(self.padded[unit], dtype=self.grad_dtype)
        full[: grad.size] = grad
        return full

    def start(self, w: Worker, x: np.ndarray) -> None:
        w.hold("act0", "activations", x)

    def loss(self, w: Worker, target: np.ndarray, global_rows: int) -> float:
        out = w.get(f"act{len(self.padded)}")
        value, dout = mlp.loss_and_grad(out, target, global_rows)
        w.hold("dout", "activations", dout)
        return value

    def finish_backward(self, w: Worker) -> None:
        w.drop("dout")
        w.drop("act0")

    # --- the optimizer -------------------------------------------------------------------------
    def init_optimizer(self, w: Worker, unit: int, weights: np.ndarray, where: slice) -> None:
        """Adam's state for ``weights[where]`` (a chunk, or everything at stage 0)."""
        part = weights[where]
        if self.master:
            w.hold(f"master{unit}", "optimizer", part.astype(np.float32))
        w.hold(f"m{unit}", "optimizer", np.zeros(part.size, np.float32))
        w.hold(f"v{unit}", "optimizer", np.zeros(part.size, np.float32))

    def adam_update(self, w: Worker, unit: int, weights: np.ndarray, where: slice, grad: np.ndarray, step: int) -> None:
        """Adam on ``weights[where]`` with its summed gradient ``grad``: elementwise, so a chunk
        updated alone gets exactly the bits it would get inside the whole vector."""
        b1, b2 = self.betas
        g = grad.astype(np.float32)
        m, v = w.get(f"m{unit}"), w.get(f"v{unit}")
        m *= b1
        m += (1 - b1) * g
        v *= b2
        v += (1 - b2) * (g * g)
        t = step + 1
        update = (self.lr / (1 - b1**t)) * m / (np.sqrt(v / (1 - b2**t)) + self.eps)
        if self.master:
            master = w.get(f"master{unit}")
            master -= update.astype(np.float32)
            weights[where] = master.astype(self.param_dtype)
        else:
            weights[where] -= update.astype(self.param_dtype)


# --- the four steps ---------------------------------------------------------------------------
# A step function gets the cluster, each worker's rows (inputs, targets), the global row count
# and the step number, and returns the summed loss. ``setup`` functions give each worker its
# initial state from the full initial weights.


def _forward_whole(c: Cluster, xs, ys, rows: int) -> float:
    total = 0.0
    for w, x, y in zip(c.workers, xs, ys):
        c.start(w, x)
        for u in c.units:
            c.forward_unit(w, u, w.get(f"weights{u}"))
        total += c.loss(w, y, rows)
    c.record("forward")
    return total


def setup_replicated(c: Cluster, units: list[np.ndarray], sharded_optimizer: bool, sharded_grads: bool = False) -> None:
    for w in c.workers:
        for u, init in enumerate(units):
            weights = np.zeros(c.padded[u], dtype=c.param_dtype)
            weights[: init.size] = init
            w.hold(f"weights{u}", "weights", weights)
            c.init_optimizer(w, u, weights, c.chunk(u, w.rank) if sharded_optimizer else slice(None))
            if sharded_grads:
                w.hold(f"gradshard{u}", "gradients", np.zeros(c.padded[u] // c.n, c.grad_dtype))


def setup_sharded(c: Cluster, units: list[np.ndarray]) -> None:
    for w in c.workers:
        for u, init in enumerate(units):
            whole = np.zeros(c.padded[u], dtype=c.param_dtype)
            whole[: init.size] = init
            shard = whole[c.chunk(u, w.rank)].copy()
            w.hold(f"weights{u}", "weights", shard)
            c.init_optimizer(w, u, shard, slice(None))
            w.hold(f"gradshard{u}", "gradients", np.zeros(shard.size, c.grad_dtype))


def ddp_step(c: Cluster, xs, ys, rows: int, step: int) -> float:
    loss = _forward_whole(c, xs, ys, rows)
    for u in reversed(c.units):
        grads = [w.hold(f"grad{u}", "gradients", c.backward_unit(w, u, w.get(f"weights{u}"))) for w in c.workers]
        c.all_reduce(grads, u)
        c.record(f"backward {u}", f"all-reduce gradients {u}")
    for w in c.workers:
        c.finish_backward(w)
        for u in c.units:
            c.adam_update(w, u, w.get(f"weights{u}"), slice(None), w.get(f"grad{u}"), step)
            w.drop(f"grad{u}")
    c.record("update")
    return loss


def zero1_step(c: Cluster, xs, ys, rows: int, step: int) -> float:
    loss = _forward_whole(c, xs, ys, rows)
    for u in reversed(c.units):
        grads = [w.hold(f"grad{u}", "gradients", c.backward_unit(w, u, w.get(f"weights{u}"))) for w in c.workers]
        c.reduce_scatter(grads, u)
        c.record(f"backward {u}", f"reduce-scatter gradients {u}")
    for w in c.workers:
        c.finish_backward(w)
        for u in c.units:
            mine = c.chunk(u, w.rank)
            c.adam_update(w, u, w.get(f"weights{u}"), mine, w.get(f"grad{u}")[mine], step)
            w.drop(f"grad{u}")
    c.record("update")
    for u in c.units:
        c.all_gather([w.get(f"weights{u}") for w in c.workers], u)
        c.record(f"all-gather {u}", f"all-gather weights {u}")
    return loss


def zero2_step(c: Cluster, xs: list, ys: list, rows: int, step: int) -> float:
    loss = _forward_whole(c, xs, ys, rows)
    for u in reversed(c.units):
        grads = [w.hold("unitgrad", "working", c.backward_unit(w, u, w.get(f"weights{u}"))) for w in c.workers]
        c.reduce_scatter(grads, u)
        c.record(f"backward {u}", f"reduce-scatter gradients {u}")
        for w, grad in zip(c.workers, grads):
            w.get(f"gradshard{u}")[...] = grad[c.chunk(u, w.rank)]
            w.drop("unitgrad")
    for w in c.workers:
        c.finish_backward(w)
        for u in c.units:
            c.adam_update(w, u, w.get(f"weights{u}"), c.chunk(u, w.rank), w.get(f"gradshard{u}"), step)
    c.record("update")
    for u in c.units:
        c.all_gather([w.get(f"weights{u}") for w in c.workers], u)
        c.record(f"all-gather {u}", f"all-gather weights {u}")
    return loss


def _gather_unit(c: Cluster, u: int, label: str) -> list[np.ndarray]:
    gathered = []
    for w in c.workers:
        whole = w.hold("gathered", "working", np.zeros(c.padded[u], c.param_dtype))
        whole[c.chunk(u, w.rank)] = w.get(f"weights{u}")
        gathered.append(whole)
    c.all_gather(gathered, u)
    c.record(f"{label} {u}", f"all-gather weights {u}")
    return gathered


def zero3_step(c: Cluster, xs, ys, rows: int, step: int) -> float:
    loss = 0.0
    for w, x in zip(c.workers, xs):
        c.start(w, x)
    for u in c.units:
        gathered = _gather_unit(c, u, "forward")
        for w, whole in zip(c.workers, gathered):
            c.forward_unit(w, u, whole)
            w.drop("gathered")
    for w, y in zip(c.workers, ys):
        loss += c.loss(w, y, rows)
    for u in reversed(c.units):
        gathered = _gather_unit(c, u, "backward")
        grads = [w.hold("unitgrad", "working", c.backward_unit(w, u, whole)) for w, whole in zip(c.workers, gathered)]
        c.reduce_scatter(grads, u)
        c.record(f"backward {u}", f"reduce-scatter gradients {u}")
        for w, grad in zip(c.workers, grads):
            w.get(f"gradshard{u}")[...] = grad[c.chunk(u, w.rank)]
            w.drop("unitgrad")
            w.drop("gathered")
    for w in c.workers:
        c.finish_backward(w)
        for u in c.units:
            c.adam_update(w, u, w.get(f"weights{u}"), slice(None), w.get(f"gradshard{u}"), step)
    c.record("update")
    return loss


StepFn = Callable[[Cluster, list, list, int, int], float]
STAGE_STEPS: dict[int, StepFn] = {0: ddp_step, 1: zero1_step, 2: zero2_step, 3: zero3_step}


def setup(c: Cluster, stage: int, units: list[np.ndarray]) -> None:
    if stage == 3:
        setup_sharded(c, units)
    else:
        setup_replicated(c, units, sharded_optimizer=stage >= 1, sharded_grads=stage == 2)


def full_weights(c: Cluster, stage: int) -> list[np.ndarray]:
    """Worker 0's view of the whole (unpadded) weights; at stage 3 the shards put together."""
    out = []
    for u, size in enumerate(c.spec.unit_sizes):
        if stage == 3:
            whole = np.concatenate([w.get(f"weights{u}") for w in c.workers])
        else:
            whole = c.workers[0].get(f"weights{u}")
        out.append(whole[:size].copy())
    return out


@dataclass
class SimResult:
    stage: int
    n_workers: int
    weights: list[np.ndarray]  # final, whole, unpadded
    losses: list[float]
    peak_model_state: list[int]  # bytes, per worker
    peak_activations: list[int]
    bytes_sent_per_step: list[int]  # per worker (the same every step)
    timeline: list[Event] = field(default_factory=list)  # worker 0's last step
    workers_agree: bool = True  # at stages 0-2 every worker ends with the same whole weights


def simulate(
    stage: int,
    n_workers: int,
    spec: mlp.MLPSpec = mlp.MLPSpec(),
    steps: int = 5,
    recipe_name: str = "fp32",
    rows: int = 32,
    lr: float = 1e-2,
    seed: int = 0,
    step_fn: StepFn | None = None,
) -> SimResult:
    """Train ``steps`` steps of Adam at ``stage`` on ``n_workers`` workers. ``step_fn`` replaces
    the stage's step (a learner's ZeRO-2, for instance)."""
    if stage not in STAGE_STEPS:
        raise ValueError(f"stage {stage!r} does not exist; choose one of 0 (DDP), 1, 2, 3")
    if not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be a positive integer, got {steps!r}")
    if not isinstance(n_workers, int) or n_workers < 1:
        raise ValueError(f"n_workers must be a positive integer, got {n_workers!r}")
    if not isinstance(rows, int) or rows < 1 or rows % n_workers:
        raise ValueError(
            f"the global batch of {rows!r} rows cannot be split evenly over "
            f"{n_workers} workers; use a multiple of {n_workers}"
        )
    c = Cluster(n_workers, spec, recipe_name, lr)
    setup(c, stage, mlp.init_units(spec, seed))
    run = step_fn or STAGE_STEPS[stage]
    losses, per = [], rows // n_workers
    sent_before = [0] * n_workers
    for step in range(steps):
        x, y = mlp.make_batch(spec, step, rows, seed)
        for w in c.workers:
            w.timeline.clear()
        sent_before = [w.sent for w in c.workers]
        losses.append(
            run(
                c,
                [x[r * per : (r + 1) * per] for r in range(n_workers)],
                [y[r * per : (r + 1) * per] for r in range(n_workers)],
                rows,
                step,
            )
        )
    agree = stage == 3 or all(
        all(np.array_equal(w.get(f"weights{u}"), c.workers[0].get(f"weights{u}")) for u in c.units) for w in c.workers
    )
    return SimResult(
        stage,
        n_workers,
        full_weights(c, stage),
        losses,
        [w.peak_model_state for w in c.workers],
        [w.peak_activations for w in c.workers],
        [w.sent - before for w, before in zip(c.workers, sent_before)],
        list(c.workers[0].timeline),
        agree,
    )
