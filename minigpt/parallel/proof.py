"""One proof, the same rulers in every lab: a distributed run held against one process.

Every lab distributes MiniGPT its own way (DDP, ZeRO-1, FSDP, tensor parallelism, a pipeline, a
mesh) and makes the same promise: *the run computes what one process would*. This module keeps
that promise measurable the same way everywhere. A lab's runner says only **what it distributes**
(a :class:`System`: how to take a step and how to hand over the whole state) and **what PyTorch
implementation it is held against**; the harness measures the rulers and decides.

The rulers, each a key of every lab's report:

1. **float64, the algorithm** (``fp64_max_step_drift`` over ``fp64_steps``). The same model and
   data in float64. Before each step the distributed state (weights and optimizer moments) is
   copied into one process, which takes the same step; the largest logit difference on the probe
   batch is the *step drift*. In float64 a reordered sum moves the result by about 1e-16, so the
   drift stays near 1e-13; a missing reduce, a wrong scale or a wrong slice moves it by 1e-3 or
   more. Criterion: <= 1e-9 at every step. This is the ruler that finds bugs.
2. **float32, the promise** (``fp32_first_step_logit_diff``, ``fp32_first_step_grad_diff``). One
   forward and backward from the same initial weights: the logits and every gradient against one
   process on the whole batch. Criterion: <= 1e-5 each.
3. **float32 over the run** (``fp32_max_step_drift``, ``fp32_worst_step``). The step drift at
   every step of the float32 run. For the **data-parallel family** (DDP, ZeRO-1, FSDP, HSDP,
   pipelines) only the order of one sum changes, and the criterion is <= 1e-5; the twin clips the
   gradient with the distributed run's own global norm (``fp32_norm_rel_diff`` says how far the
   two norms were), since AdamW turns a last-bit difference of the clipping scale into a
   difference of every weight. For **tensor, sequence and context parallelism** every layer's sums
   are reordered, AdamW amplifies each rounding, and the drift grows with the run exactly as it
   does for PyTorch's own implementation: it is reported beside PyTorch's figure, not judged
   alone (the lab decides what it is held against).
4. **PyTorch's own** (``same_as_pytorch``, ``pytorch_impl``, ``pytorch_max_diff``): measured by
   the lab, judged here.
5. **Bytes and memory**: equal to the model; ranks that must agree bit-identical.

:class:`Verdict` collects the rulers, prints one line per ruler and, when one is broken, one line
naming it with the measured value: ``criterion_pass`` is the exit status.

The single-process twins of the steps are shared over the ranks (:class:`SharedTwins`).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Protocol

import torch
import torch.distributed as dist

from minigpt import grammar
from minigpt.parallel import equivalence
from minigpt.parallel.bounds import (  # noqa: F401 - the rulers' bounds, read as proof.<name> too
    FP32_DRIFT_BOUND,
    FP32_ONE_STEP_BOUND,
    FP64_DRIFT_BOUND,
    FP64_MIN_STEPS,
    PYTORCH_DRIFT_FACTOR,
    PYTORCH_ONE_STEP_BOUND,
    close_to_pytorch,
    drift_bound,
)
from minigpt.train import TrainConfig, build_model, build_optimizer, train_step

DATA_PARALLEL, MODEL_PARALLEL = "data-parallel", "model-parallel"
# the keys every lab's ``--check --report`` writes (tests/ check them in each lab's report)
REPORT_KEYS = (
    "fp32_first_step_logit_diff",
    "fp32_first_step_grad_diff",
    "fp64_max_step_drift",
    "fp64_steps",
    "fp32_max_step_drift",
    "fp32_worst_step",
    "same_as_pytorch",
    "pytorch_impl",
    "pytorch_max_diff",
    "criterion_pass",
    "rulers",
    "seconds",
)
State = dict  # {"weights": {name: tensor}, "moments": {key: {name: tensor}}, "step": tensor or None}


# ----------------------------------------------------------------------------------------------
# The rulers on a GPU

CUBLAS_WORKSPACE = ":4096:8"  # what cuBLAS needs to run its matrix products deterministically


def rulers_on(device: torch.device) -> dict:
    """Make the twins of a ``--check`` on ``device`` compute what the rulers assume, and say what was set.

    On a CPU nothing changes: its kernels are deterministic. On CUDA three settings, each taken from
    PyTorch's reproducibility notes: TF32 off (an Ampere or newer GPU would otherwise round float32
    matrix products to 10 bits of mantissa, a drift of 1e-3, far above the 1e-5 rulers);
    deterministic algorithms, where PyTorch has them (``index_add_``, the backward of ``index_select``,
    adds with atomics, whose order, and so whose float32 rounding, changes from run to run); cuBLAS's
    fixed workspace, which those algorithms need. ``warn_only``: an operation with no deterministic version warns
    (naming it) instead of stopping the run. What stays different on a GPU is the order of the sums
    inside NCCL's all-reduce, which depends on the number of ranks and the GPUs' links: two ranks add
    two numbers (``a + b = b + a``, bit-identical to gloo and to PyTorch's DDP), more ranks do not."""
    if device.type != "cuda":
        return {}
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = True
    torch.use_deterministic_algorithms(True, warn_only=True)
    return cuda_settings()


def cuda_settings() -> dict:
    """The settings :func:`rulers_on` makes, as they are now (a ``--check``'s report records them)."""
    return {
        "allow_tf32_matmul": torch.backends.cuda.matmul.allow_tf32,
        "allow_tf32_cudnn": torch.backends.cudnn.allow_tf32,
        "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
        "cublas_workspace_config": os.environ.get("CUBLAS_WORKSPACE_CONFIG"),
    }


# ----------------------------------------------------------------------------------------------
# What a lab hands the harness


@dataclass
class FirstStep:
    """One forward and backward of step 0's batch, no optimizer step, as this rank sees it:
    ``logits`` of the batch rows ``rows`` (None where this rank has none, e.g. a pipeline's first
    stage), and the whole gradient of every parameter this rank can give whole (MiniGPT's names;
    a sharded system gathers them)."""

    rows: slice | None
    logits: torch.Tensor | None
    grads: dict[str, torch.Tensor]
    tokens: torch.Tensor | None = None  # the positions of the logits' tokens (context parallelism)


class System(Protocol):
    """A distributed MiniGPT as the harness sees it. Every method is called on every rank."""

    def train_step(self, step: int) -> tuple[float, torch.Tensor | None]:
        """One optimizer step on ``step``'s batch: the loss of the global batch (every rank) and the
        global gradient norm the step clipped by (None without clipping)."""

    def whole_state(self) -> State:
        """The whole weights and optimizer state in MiniGPT's names, on every rank (a collective)."""

    def first_step(self) -> FirstStep:
        """One forward and backward of step 0's batch from the initial weights, no optimizer step."""


def whole(t: torch.Tensor) -> torch.Tensor:
    """A whole copy of a tensor, or of a DTensor gathered (every rank of its mesh calls it). A copy
    always: a replicated DTensor's ``full_tensor()`` is its local tensor itself, which the
    optimizer's next step would change under the caller."""
    t = t.detach()
    return (t.full_tensor() if hasattr(t, "full_tensor") else t).clone()


def data_parallel_first_step(forward, grads, cfg: TrainConfig, ctx) -> FirstStep:
    """:meth:`System.first_step` of a data-parallel system: step 0's forward and backward on this
    rank's rows. ``forward(x, y, mask)`` returns ``(logits, loss)``; ``grads()`` the whole gradients
    by name once backward is done (averaged over the ranks: what the system's backward leaves)."""
    batch = grammar.get_batch(
        "train", 0, cfg.batch_size, ctx.rank, ctx.world_size, seed=cfg.seed, block_size=cfg.block_size
    )
    logits, loss = forward(*(t.to(ctx.device) for t in batch))
    loss.backward()
    return FirstStep(grammar.rank_slice(cfg.batch_size, ctx.rank, ctx.world_size), whole(logits), grads())


def named_grads(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter's gradient by name (a DTensor's gathered whole), for :func:`data_parallel_first_step`."""
    return {n: whole(p.grad) for n, p in model.named_parameters() if p.grad is not None}


def plain_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> State:
    """The :data:`State` of a model every rank holds whole (DDP), or as DTensors (FSDP2, which are
    gathered: a collective), with its optimizer's moments by parameter name (copies: the optimizer
    updates its own in place)."""
    state: State = {"weights": {n: whole(p) for n, p in model.state_dict().items()}, "moments": {}}
    state["step"] = None
    for name, p in model.named_parameters():
        per = optimizer.state.get(p, {})
        for key, value in per.items():
            if key == "step":
                state["step"] = whole(value)
            elif torch.is_tensor(value):
                state["moments"].setdefault(key, {})[name] = whole(value)
    return state


def clip_capture(
    optimizer: torch.optim.Optimizer, clip: Callable[[float], torch.Tensor]
) -> Callable[[], torch.Tensor | None]:
    """Make ``optimizer`` clip with ``clip(max_norm)`` (which returns the global norm;
    :func:`minigpt.train.train_step` asks the optimizer first) and keep the norm; returns the getter of
    the last one, for :meth:`System.train_step` to return."""
    last: list[torch.Tensor | None] = [None]

    def clip_and_keep(max_norm: float) -> torch.Tensor:
        last[0] = clip(max_norm)
        return last[0]

    optimizer.clip_grad_norm_ = clip_and_keep
    return lambda: last[0]


def run_norm_capture(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> Callable[[], torch.Tensor | None]:
    """:func:`clip_capture` with what :func:`minigpt.train.train_step` does by itself
    (``clip_grad_norm_`` over the model's parameters), for a :class:`System` whose ranks hold the
    whole, averaged gradient."""
    return clip_capture(optimizer, lambda max_norm: torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm))


# ----------------------------------------------------------------------------------------------
# The single-process twin


class Twin:
    """One process that, given a distributed run's whole state before a step, takes the same step on
    the whole batch. ``clip_norm``: with a norm, the twin clips with it instead of its own (the rest
    of the step its own), which takes the norm's float32 rounding out of the measure."""

    def __init__(self, cfg: TrainConfig, device: torch.device | str = "cpu"):
        self.cfg = cfg
        self.model = build_model(cfg).to(device)
        self.probe = equivalence.Probe(build_model(cfg), block_size=cfg.block_size)
        self.own_norm: float | None = None

    def step(self, step: int, before: State, clip_norm: torch.Tensor | None = None) -> torch.nn.Module:
        """The twin's model after ``step`` taken from ``before``."""
        self.model.load_state_dict(before["weights"])
        optimizer = build_optimizer(self.model, self.cfg)
        if before["moments"]:
            for name, p in self.model.named_parameters():
                if not p.requires_grad:
                    continue
                optimizer.state[p] = {key: value[name].clone() for key, value in before["moments"].items()}
                if before.get("step") is not None:
                    optimizer.state[p]["step"] = before["step"].clone()

        def clip(max_norm: float) -> torch.Tensor:
            own = torch.nn.utils.get_total_norm([p.grad for p in self.model.parameters() if p.grad is not None])
            self.own_norm = float(own)
            norm = own if clip_norm is None else clip_norm.detach().to(own.device, own.dtype)
            torch.nn.utils.clip_grads_with_norm_(self.model.parameters(), max_norm, norm)
            return norm

        optimizer.clip_grad_norm_ = clip
        train_step(self.model, optimizer, step, self.cfg)
        return self.model

    def drift(self, step: int, before: State, after: dict, clip_norm: torch.Tensor | None = None) -> float:
        """The step drift: max |logits| difference on the probe, both computed exactly (float64)."""
        return self.probe.drift(self.step(step, before, clip_norm), after)


# ----------------------------------------------------------------------------------------------
# Ruler 3 (and 1, in float64): the step drift at every step, the twins shared over the ranks


@dataclass
class DriftRun:
    """What :func:`run_with_twin` measured: the step drift at every step, the losses, and how far
    the twin's own norm was from the run's (the largest relative difference)."""

    drift: equivalence.DriftLog = field(default_factory=equivalence.DriftLog)
    own_norm_drift: equivalence.DriftLog = field(default_factory=equivalence.DriftLog)  # (also_own_norm)
    losses: list[float] = field(default_factory=list)
    norm_rel_diff: float = 0.0
    clipped_steps: list[int] = field(default_factory=list)  # steps whose norm was above max_norm
    bits_differ: list[int] = field(default_factory=list)  # (same_bits) steps whose twin is not the run's bits
    also: equivalence.DriftLog = field(default_factory=equivalence.DriftLog)  # (also) one more measure per step

    def summary(self) -> dict:
        return {
            **self.drift.summary(),
            "steps": len(self.drift.values),
            "norm_rel_diff": self.norm_rel_diff,
            "clipped_steps": self.clipped_steps,
        }


class SharedTwins:
    """The twins of a run, shared over the ranks: rank ``(s + offset) % world_size`` keeps step ``s``'s
    states and computes its twin at the end of each window of steps.

    Every step's twin (one process's step on the whole batch, and two float64 forwards of the probe)
    costs more than a rank's share of the distributed step, so the ranks share the twins: the rank
    that owns step ``s`` keeps the state before and after it; every ``window`` steps each rank
    computes the twins of the steps it owns, and one all-reduce shares the drifts. (A twin computed
    right after its step would make the other ranks wait for it at the next collective: the
    training keeps the ranks in lockstep.) Two sets of twins of one run (Lab 01's whole batch and its
    ranks' micro-batches) take ``offset`` 0 and 1, so that a step's two twins go to two ranks.

    ``same_bits``: :meth:`keep` takes the run's digest after the step (:func:`equivalence.digest` of
    its parameters); a twin with the same bits is the run's (drift 0, no probe), and a step whose
    twin differs is listed (``DriftRun.bits_differ``). ``also(twin_model, after)``: one more measure
    of each twin (``DriftRun.also``)."""

    def __init__(
        self,
        cfg: TrainConfig,
        ctx,
        twin_norm: str,
        window: int | None = None,
        also_own_norm: bool = False,
        offset: int = 0,
        same_bits: bool = False,
        also: Callable[[torch.nn.Module, dict], float] | None = None,
    ):
        self.cfg, self.ctx, self.twin_norm = cfg, ctx, twin_norm
        self.also_own_norm = also_own_norm and twin_norm == "run"  # both drifts: the twin steps twice
        self.window = window or 4 * ctx.world_size
        self.offset, self.same_bits, self.also = offset, same_bits, also
        self.twin = Twin(cfg, ctx.device)
        self.kept: list[tuple[int, State, dict, torch.Tensor | None, str | None]] = []
        self.first = 0  # the first step of the current window

    def owns(self, step: int) -> bool:
        """Whether this rank computes the twin of ``step``."""
        return (step + self.offset) % self.ctx.world_size == self.ctx.rank

    def keep(
        self, step: int, before: State, after: State, norm: torch.Tensor | None, digest: str | None = None
    ) -> bool:
        """Call on every rank after every step; True when the window is full (then call :meth:`share`)."""
        if self.owns(step):
            self.kept.append((step, before, after["weights"], None if norm is None else whole(norm), digest))
        return step + 1 - self.first >= self.window

    def share(self, last: int, run: DriftRun) -> None:
        """Compute this rank's twins of steps ``first .. last``; one all-reduce shares every drift."""
        n = last + 1 - self.first
        # drift, |norm difference| / norm, clipped, own norm's drift, bits differ, also
        found = torch.zeros(6 * n, dtype=torch.float64)
        for step, before, after, norm, digest in self.kept:
            i = step - self.first
            clip_norm = norm if self.twin_norm == "run" else None
            if self.also_own_norm:
                found[3 * n + i] = self.twin.drift(step, before, after, None)
            model = self.twin.step(step, before, clip_norm)
            differs = not self.same_bits or equivalence.params_digest(model) != digest
            found[4 * n + i] = float(differs)
            if differs:  # the same bits give the same logits: no probe needed
                found[i] = self.twin.probe.drift(model, after)
            if self.also is not None:
                found[5 * n + i] = self.also(model, after)
            if norm is not None and self.twin.own_norm is not None:
                found[n + i] = abs(float(norm) - self.twin.own_norm) / max(float(norm), 1e-30)
                found[2 * n + i] = float(float(norm) > self.cfg.grad_clip)
        self.kept.clear()
        found = found.to(self.ctx.device)
        dist.all_reduce(found)  # each entry was filled by one rank only
        found = found.cpu()
        for i in range(n):
            run.drift.add(float(found[i]))
            run.norm_rel_diff = max(run.norm_rel_diff, float(found[n + i]))
            if found[2 * n + i]:
                run.clipped_steps.append(self.first + i)
            if self.also_own_norm:
                run.own_norm_drift.add(float(found[3 * n + i]))
            if self.same_bits and found[4 * n + i]:
                run.bits_differ.append(self.first + i)
            if self.also is not None:
                run.also.add(float(found[5 * n + i]))
        self.first = last + 1


def run_with_twin(
    system: System,
    cfg: TrainConfig,
    ctx,
    twin_norm: str = "run",
    on_step: Callable[[int, float, DriftRun], None] | None = None,
    check: bool = True,
    steps: int | None = None,
    also_own_norm: bool = False,
) -> DriftRun:
    """Train ``system`` for ``steps`` steps (default ``cfg.steps``, whose schedule the learning rate
    follows either way); with ``check``, the step drift of every step against
    one process (the twin clips with the run's norm, ``twin_norm="run"``, or with its own, ``"own"``).
    ``on_step(step, loss, run)`` after every step (progress, a divergence watch, bytes). With
    ``also_own_norm`` the twin also takes each step clipping with its own norm (reported beside)."""
    run = DriftRun()
    twins = SharedTwins(cfg, ctx, twin_norm, also_own_norm=also_own_norm) if check else None
    steps = cfg.steps if steps is None else steps
    before = system.whole_state() if check else None
    for step in range(steps):
        loss, norm = system.train_step(step)
        run.losses.append(loss)
        if twins is not None:
            after = system.whole_state()
            if twins.keep(step, before, after, norm) or step == steps - 1:
                twins.share(step, run)
            before = after
        if on_step is not None:
            on_step(step, loss, run)
    return run


# ----------------------------------------------------------------------------------------------
# Ruler 2: the first step


def one_process_first_step(cfg: TrainConfig, device: torch.device | str = "cpu") -> tuple[torch.Tensor, dict]:
    """One process's logits and gradients of one forward and backward on step 0's whole batch."""
    model = build_model(cfg).to(device)
    x, y, mask = (
        t.to(device) for t in grammar.get_batch("train", 0, cfg.batch_size, seed=cfg.seed, block_size=cfg.block_size)
    )
    logits, loss = model(x, y, mask)
    loss.backward()
    grads = {n: p.grad.detach() for n, p in model.named_parameters() if p.grad is not None}
    grads["lm_head.weight"] = grads["wte.weight"]
    return logits.detach(), grads


def first_step_diffs(first: FirstStep, cfg: TrainConfig, ctx) -> dict:
    """Ruler 2: the largest logit and gradient differences from one process (max over the ranks)."""
    logits, grads = one_process_first_step(cfg, ctx.device)
    logit_diff = 0.0
    if first.logits is not None:
        rows = first.rows if first.rows is not None else slice(None)
        expected = logits[rows] if first.tokens is None else logits[rows][:, first.tokens]
        logit_diff = float((first.logits.detach().to(logits.dtype) - expected).abs().max())
    grad_diff = max(
        (float((whole(g).to(grads[n].dtype) - grads[n]).abs().max()) for n, g in first.grads.items() if n in grads),
        default=0.0,
    )
    found = torch.tensor([logit_diff, grad_diff, float(len(first.grads))], dtype=torch.float64, device=ctx.device)
    dist.all_reduce(found[:2], op=dist.ReduceOp.MAX)
    return {"logit_diff": float(found[0]), "grad_diff": float(found[1])}


# ----------------------------------------------------------------------------------------------
# The verdict: one line per ruler, one line naming each broken one


@dataclass
class Ruler:
    key: str  # the report key that holds the measured value
    value: object
    criterion: str  # e.g. "<= 1e-09", "= 2,922,240 (the model)", "true", "reported"
    passed: bool | None  # None: reported, not a criterion
    what: str = ""

    def line(self) -> str:
        mark = {True: "PASS", False: "FAIL", None: "reported"}[self.passed]
        return f"{mark:8} {self.key}: {_show(self.value)} ({self.criterion}){f' - {self.what}' if self.what else ''}"


def _show(value) -> str:
    if isinstance(value, float) and value.is_integer() and abs(value) >= 1:
        return f"{int(value):,}"  # a count (bytes) that went through a float: every digit, as the measured one
    if isinstance(value, float):
        return "nan" if math.isnan(value) else f"{value:.3g}" if value >= 1e-3 or value == 0 else f"{value:.2e}"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


@dataclass
class Verdict:
    """The rulers of one check, in order; ``criterion_pass`` when every criterion holds."""

    rulers: list[Ruler] = field(default_factory=list)

    @classmethod
    def of(cls, report: dict) -> Verdict:
        """The verdict a report holds (its ``rulers``), to print it again."""
        return cls(
            [Ruler(r["key"], r["value"], r["criterion"], r["pass"], r.get("what", "")) for r in report["rulers"]]
        )

    def at_most(self, key: str, value: float, bound: float, what: str = "") -> None:
        ok = value is not None and not math.isnan(value) and value <= bound
        self.rulers.append(Ruler(key, value, f"<= {bound:.3g}", ok, what))

    def equal(self, key: str, measured, expected, what: str = "") -> None:
        self.rulers.append(Ruler(key, measured, f"= {_show(expected)}", measured == expected, what))

    def true(self, key: str, flag: bool, what: str = "") -> None:
        self.rulers.append(Ruler(key, bool(flag), "must be true", bool(flag), what))

    def reported(self, key: str, value, what: str = "") -> None:
        self.rulers.append(Ruler(key, value, "reported, not a criterion", None, what))

    @property
    def criterion_pass(self) -> bool:
        return all(r.passed is not False for r in self.rulers)

    def failed(self) -> list[Ruler]:
        return [r for r in self.rulers if r.passed is False]

    def lines(self, headline: str | None = None) -> list[str]:
        """One line per ruler, then the verdict (``headline`` after "check PASS: " if given: a lab's
        own one-line story), then one line per broken ruler."""
        out = [r.line() for r in self.rulers]
        broken = self.failed()
        criteria = sum(r.passed is not None for r in self.rulers)
        if broken:
            out.append(f"check FAIL: {len(broken)} of {criteria} criteria broken")
        else:
            out.append(f"check PASS: {headline or f'all {criteria} criteria hold'}")
        out += [f"broken ruler {r.key}: measured {_show(r.value)}, criterion {r.criterion}" for r in broken]
        return out

    def keys(self) -> dict:
        """The report's ``criterion_pass`` and ``rulers``."""
        return {
            "criterion_pass": self.criterion_pass,
            "rulers": [
                {"key": r.key, "value": r.value, "criterion": r.criterion, "pass": r.passed, "what": r.what}
                for r in self.rulers
            ],
            "broken_rulers": [r.key for r in self.failed()],
        }


# ----------------------------------------------------------------------------------------------
# The shared part of every check


@dataclass
class Proof:
    """The three drift rulers of one system: a lab's runner calls :meth:`first_step`,
    :meth:`float64` and keeps the float32 run's :class:`DriftRun`, then :meth:`judge`."""

    family: str  # DATA_PARALLEL or MODEL_PARALLEL
    twin_norm: str = "run"  # the float32 twin clips with the run's norm ("run") or its own ("own")
    report: dict = field(default_factory=dict)
    verdict: Verdict = field(default_factory=Verdict)
    first: FirstStep | None = None  # the system's first step that ruler 2 measured (a lab may hold it to more)

    def first_step(self, build: Callable[[TrainConfig], System], cfg: TrainConfig, ctx) -> dict:
        """Ruler 2 on a fresh float32 system."""
        f32 = replace(cfg, dtype="float32")
        self.first = build(f32).first_step()
        found = first_step_diffs(self.first, f32, ctx)
        self.report.update(fp32_first_step_logit_diff=found["logit_diff"], fp32_first_step_grad_diff=found["grad_diff"])
        return found

    def float64(self, build: Callable[[TrainConfig], System], cfg: TrainConfig, ctx, steps: int) -> DriftRun:
        """Ruler 1: the first ``steps`` steps of a float64 system against a float64 twin (its own norm:
        in float64 the norms agree to 1e-16)."""
        f64 = replace(cfg, dtype="float64")
        run = run_with_twin(build(f64), f64, ctx, twin_norm="own", steps=min(steps, cfg.steps))
        self.report.update(fp64_max_step_drift=run.drift.worst, fp64_steps=len(run.drift.values))
        return run

    def float32(self, run: DriftRun | dict) -> None:
        """Ruler 3's keys from the float32 run (or from its :meth:`DriftRun.summary`)."""
        summary = run.summary() if isinstance(run, DriftRun) else run
        self.report.update(
            fp32_max_step_drift=summary["max"],
            fp32_worst_step=summary["worst_step"],
            fp32_steps=summary["steps"],
            fp32_norm_rel_diff=summary["norm_rel_diff"],
            fp32_twin_clips_with=self.twin_norm,
        )

    def judge(self) -> Verdict:
        """The drift rulers into the verdict (the lab adds PyTorch's, bytes and memory after)."""
        r, v = self.report, self.verdict
        if "fp64_max_step_drift" in r:
            v.at_most(
                "fp64_max_step_drift", r["fp64_max_step_drift"], FP64_DRIFT_BOUND, f"float64, {r['fp64_steps']} steps"
            )
        if "fp32_first_step_logit_diff" in r:
            v.at_most("fp32_first_step_logit_diff", r["fp32_first_step_logit_diff"], FP32_ONE_STEP_BOUND)
            v.at_most("fp32_first_step_grad_diff", r["fp32_first_step_grad_diff"], FP32_ONE_STEP_BOUND)
        if "fp32_max_step_drift" in r:
            where = f"float32, {r['fp32_steps']} steps, worst at step {r['fp32_worst_step']}"
            if self.family == DATA_PARALLEL:
                v.at_most("fp32_max_step_drift", r["fp32_max_step_drift"], FP32_DRIFT_BOUND, where)
            else:
                v.reported("fp32_max_step_drift", r["fp32_max_step_drift"], where)
        return v


def combined(parts: list[dict], float32: dict | None = None) -> dict:
    """One check's harness keys from the proofs of its parts (a lab's layouts, variants or meshes,
    each a :class:`Proof`'s report): each drift and difference its worst part's, each step count its
    fewest; the float32 run's keys are the worst part's, or those of ``float32`` (the part whose
    family's criterion judges the whole check)."""
    parts = [p for p in parts if p]

    def worst(key: str) -> float:
        return max(p[key] for p in parts if key in p)

    out = {
        "fp64_max_step_drift": worst("fp64_max_step_drift"),
        "fp64_steps": min(p["fp64_steps"] for p in parts if "fp64_steps" in p),
        "fp32_first_step_logit_diff": worst("fp32_first_step_logit_diff"),
        "fp32_first_step_grad_diff": worst("fp32_first_step_grad_diff"),
    }
    if float32 is None:
        runs = [p for p in parts if "fp32_max_step_drift" in p]
        out.update(
            fp32_max_step_drift=worst("fp32_max_step_drift"),
            fp32_worst_step=max(runs, key=lambda p: p["fp32_max_step_drift"])["fp32_worst_step"],
            fp32_steps=min(p["fp32_steps"] for p in runs),
            fp32_norm_rel_diff=worst("fp32_norm_rel_diff"),
            fp32_twin_clips_with=runs[0]["fp32_twin_clips_with"],
        )
    else:
        out.update({k: float32[k] for k in FLOAT32_KEYS})
    return out


FLOAT32_KEYS = ("fp32_max_step_drift", "fp32_worst_step", "fp32_steps", "fp32_norm_rel_diff", "fp32_twin_clips_with")


def against_pytorch(parts: list[dict]) -> dict:
    """Ruler 4 for the model-parallel family (Labs 05-07), from the proofs of a check's parts held
    against PyTorch's own implementation (each with ``pytorch_first_step_logit_diff``,
    ``fp32_max_step_drift`` and ``pytorch_fp32_max_step_drift``): each difference its worst part's,
    ``pytorch_max_diff`` the first step's logits, ``same_as_pytorch`` when every part is
    :func:`close_to_pytorch`."""
    logits = max(p["pytorch_first_step_logit_diff"] for p in parts)
    return {
        "pytorch_first_step_logit_diff": logits,
        "pytorch_max_diff": logits,
        "pytorch_fp32_max_step_drift": max(p["pytorch_fp32_max_step_drift"] for p in parts),
        "same_as_pytorch": all(
            close_to_pytorch(
                p["pytorch_first_step_logit_diff"], p["fp32_max_step_drift"], p["pytorch_fp32_max_step_drift"]
            )
            for p in parts
        ),
    }
