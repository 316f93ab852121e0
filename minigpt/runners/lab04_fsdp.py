"""Lab 04: our own FSDP (:mod:`minigpt.parallel.fsdp_by_hand`) trains MiniGPT, held against one process and FSDP2.

    torchrun --nproc_per_node=2 lab/04_fsdp.py                                 # train, tutor accuracy
    torchrun --nproc_per_node=2 lab/04_fsdp.py --check --report out/lab04.json   # ... and the proofs
    torchrun --nproc_per_node=2 lab/04_fsdp.py --check --impl exercises          # with your exercises
    python lab/04_fsdp.py --render lab/results/04-fsdp-cpu.json                  # the page's tables

Every rank builds MiniGPT from ``--seed``, makes each block a unit and then the root (the block
policy of Lab 03), and trains with AdamW on its slice of each global batch. ``--check`` adds:

* **one process** - before every step the full state (weights and AdamW moments, gathered) is
  loaded into a single-process MiniGPT that takes the same step on the whole batch; the largest
  logit difference on the probe batch after the two steps (Lab 01's float64 probe) is the step
  drift, criterion 1e-5; the same for a float64 run (proof.py's ruler 1, 1e-9); after every step the
  ranks' gathered weights must be bit-identical;
* **FSDP2** - PyTorch's ``fully_shard`` with the same policy trains in lockstep from the same
  weights; after every step the two sets of weights are compared (with clipping, and without);
* **bytes** - what each rank sends per step, against Lab 02's ZeRO-3 model and FSDP2's bytes;
* **order** - our schedule of all-gathers, computations and reduce-scatters against FSDP2's,
  recorded by Lab 03's tracer, for four prefetch settings;
* **memory** - the peak of parameters and gradients this rank holds during a step;
* **mixed precision**, **checkpoint** (saved on 2 ranks, loaded on 1 and on all), **speed**
  (our step against FSDP2's, interleaved rounds).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch
import torch.distributed as dist

from minigpt import cli, grammar, impl, profiler
from minigpt.divergence import Watch
from minigpt.fsdp.sharded_state import MIXED_PRECISION
from minigpt.fsdp.trace import FSDPTracer
from minigpt.fsdp.variants import VARIANTS, sharded_optimizer, world_mesh, wrap
from minigpt.parallel import equivalence, fsdp_by_hand as ours, launch, proof
from minigpt.parallel.fsdp_by_hand.gradients import local_norms
from minigpt.runners import entry
from minigpt.train import TrainConfig, build_model, build_optimizer, train_step
from minigpt.zero import comm

PROG = "lab/04_fsdp.py"
# our prefetch settings and the FSDP2 variant of Lab 03 that matches each
SETTINGS = {
    "implicit": "fsdp2-implicit",
    "forward prefetch 1": "fsdp2-explicit-forward",
    "backward prefetch 2": "fsdp2-explicit-backward",
    "no reshard after forward": "fsdp2-no-reshard",
}
DEFAULT_FSDP2_STEPS = 20  # --check: FSDP2 beside ours for these steps (--full: every step)
DEFAULT_SHORT_STEPS = 5  # --check: the no-clipping and mixed-precision runs


# ----------------------------------------------------------------------------------------------
# Building the two sharded models


CLIP_NORMS = ("per-parameter", "one-number")


@torch.no_grad()
def global_grad_norm_one_number(model: torch.nn.Module) -> torch.Tensor:
    """The global norm with one all-reduce of one number: each rank's norm of its pieces' norms,
    squared, summed over the ranks, square-rooted. Equal on paper; its last float32 bit differs
    from FSDP2's (and from one process's) now and then, and the page measures what AdamW makes of
    that over a whole training."""
    norms = local_norms(model)
    if not norms:
        return torch.zeros((), device=next(model.parameters()).device)
    squares = torch.linalg.vector_norm(torch.stack(norms)).pow(2)
    dist.all_reduce(squares, op=dist.ReduceOp.SUM, group=ours.find_units(model)[0].group)
    return squares.pow(0.5)


def _one_number_clipping_norm(unit, model: torch.nn.Module) -> torch.Tensor:
    norm = global_grad_norm_one_number(model)
    unit.record_collective("all-reduce", norm.reshape(1), is_async=False)  # one number per rank
    return norm


def shard_ours(
    model: torch.nn.Module,
    setting: str = "implicit",
    recorder=None,
    mp=None,
    group=None,
    clip_norm: str = "per-parameter",
):
    """Our FSDP on MiniGPT with the block policy and a prefetch ``setting`` of :data:`SETTINGS`;
    ``clip_norm="one-number"`` takes the global norm with one all-reduce of one number."""
    unit_class = impl.load("lab04_fsdp", "FSDPUnit")
    if clip_norm == "one-number":
        unit_class = type("OneNumberNormUnit", (unit_class,), {"clipping_norm": _one_number_clipping_norm})
    blocks = list(model.blocks)
    reshard = setting != "no reshard after forward"
    for block in blocks:
        ours.fully_shard(block, group, reshard, mp, recorder, unit_class)
    ours.fully_shard(model, group, True, mp, recorder, unit_class)
    units = [model, *blocks]  # forward order
    if setting == "forward prefetch 1":
        for i, unit in enumerate(units):
            ours.set_modules_to_forward_prefetch(unit, blocks[i : i + 1])
    if setting == "backward prefetch 2":
        for i, unit in enumerate(units):  # backward: the root first, then blocks 3, 2, 1, 0
            before = blocks[: i - 1] if unit is not model else blocks
            ours.set_modules_to_backward_prefetch(unit, before[::-1][:2])
    return model


def optimizer_of(model: torch.nn.Module, cfg: TrainConfig) -> torch.optim.Optimizer:
    """AdamW over the shards, as :func:`minigpt.train.build_optimizer` groups them; it knows how to
    clip by the global norm (``train_step`` asks the optimizer first)."""
    optimizer = build_optimizer(model, cfg)

    def clip(max_norm: float) -> torch.Tensor:
        optimizer.last_norm = ours.clip_grad_norm_(model, max_norm)  # kept for --check
        return optimizer.last_norm

    optimizer.clip_grad_norm_ = clip
    return optimizer


def fsdp2_model(cfg: TrainConfig, ctx: launch.DistContext, variant: str = "fsdp2-implicit", mp=None):
    if mp is not None:
        from torch.distributed.fsdp import fully_shard

        model, mesh = build_model(cfg).to(ctx.device), world_mesh(ctx.device)
        for block in model.blocks:
            fully_shard(block, mesh=mesh, mp_policy=mp)
        fully_shard(model, mesh=mesh, mp_policy=mp)
        return model, [(f"blocks.{i}", b, b) for i, b in enumerate(model.blocks)]
    return wrap(VARIANTS[variant], build_model(cfg).to(ctx.device), ctx.device)


def fsdp2_full(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.full_tensor() if hasattr(v, "full_tensor") else v for k, v in model.state_dict().items()}


def max_difference(a: dict, b: dict) -> float:
    return max(float((a[k].double() - b[k].double()).abs().max()) for k in a if a[k].is_floating_point())


# ----------------------------------------------------------------------------------------------
# What the models predict


def model_bytes(cfg: TrainConfig, world_size: int, param_bytes: int = 4, grad_bytes: int = 4) -> int:
    """Lab 02's ZeRO-3 model of one step's bytes per rank, unit by unit: each parameter padded to
    a multiple of N rows; the root all-gathered once (kept for backward), each block twice; one
    reduce-scatter per unit."""
    model = build_model(cfg)
    in_blocks = {id(p) for b in model.blocks for p in b.parameters()}

    def padded(params) -> int:
        return sum(comm.padded(p.shape[0], world_size) * (p.numel() // p.shape[0]) for p in params)

    sizes = [padded([p for p in model.parameters() if id(p) not in in_blocks])]
    sizes += [padded(list(b.parameters())) for b in model.blocks]
    reshard = [False] + [True] * cfg.n_layer
    collectives = comm.unit_collectives(sizes, 3, world_size, param_bytes, grad_bytes, reshard, pad=False)
    return int(sum(c.bytes_sent for c in collectives))


def memory_model(cfg: TrainConfig, world_size: int, setting: str) -> dict:
    """The peak of parameters and gradients one rank holds during a step (fp32), from the units'
    sizes: the shards (weights, and the gradients reduced so far) plus the whole units alive at
    once. The candidates, largest wins:

    * forward: the root (kept whole) and 1 + forward-prefetch blocks gathered;
    * the k-th block of backward, once its gradients are ready and before it is freed: its
      weights and its full gradients, the blocks prefetched ahead (backward depth, or every
      block not yet run without resharding), the root whole, the gradients of the final norm
      (its backward comes first; the tied matrix's waits for its second use, the embedding),
      and k blocks' shard gradients;
    * the end: the root whole with its full gradients, every block's shard gradients.
    """
    model = build_model(cfg)
    in_blocks = {id(p) for b in model.blocks for p in b.parameters()}
    root = [p for p in model.parameters() if id(p) not in in_blocks]
    block = list(model.blocks[0].parameters())

    def padded(params) -> int:
        return 4 * sum(comm.padded(p.shape[0], world_size) * (p.numel() // p.shape[0]) for p in params)

    def whole(params) -> int:
        return 4 * sum(p.numel() for p in params)

    n = cfg.n_layer
    shards = (padded(root) + n * padded(block)) // world_size
    root_full, block_full, block_shard_grad = whole(root), whole(block), padded(block) // world_size
    final_norm_grads = whole(list(model.ln_f.parameters()))
    forward_depth = 1 if setting == "forward prefetch 1" else 0
    backward_depth = 2 if setting == "backward prefetch 2" else 1
    reshard = setting != "no reshard after forward"
    candidates = {"forward": shards + root_full + (1 + forward_depth if reshard else n) * block_full}
    for k in range(n):
        ahead = min(backward_depth, n - 1 - k) if reshard else n - 1 - k
        candidates[f"backward of block {n - 1 - k}"] = (
            shards + root_full + final_norm_grads + k * block_shard_grad + (2 + ahead) * block_full
        )
    candidates["end"] = shards + n * block_shard_grad + 2 * root_full
    where = max(candidates, key=candidates.__getitem__)
    return {"peak": candidates[where], "where": where, "shards": shards, "root": root_full, "block": block_full}


# ----------------------------------------------------------------------------------------------
# The proofs


class FSDPSystem:
    """Our FSDP on MiniGPT as the proof harness sees it (:class:`minigpt.parallel.proof.System`); with
    ``fsdp2_steps``, PyTorch's FSDP2 trains beside it from the same weights for that many steps and
    the two sets of weights are compared after each (they must be bit-identical)."""

    def __init__(
        self,
        cfg: TrainConfig,
        ctx: launch.DistContext,
        clip_norm: str = "per-parameter",
        recorder: ours.Recorder | None = None,
        fsdp2_steps: int = 0,
        trace: profiler.StepTrace | None = None,
    ):
        self.cfg, self.ctx, self.recorder, self.trace = cfg, ctx, recorder, trace
        self.traced: dict | None = None  # what the profiler's trace shows (--trace)
        self.model = shard_ours(build_model(cfg).to(ctx.device), recorder=recorder, clip_norm=clip_norm)
        self.optimizer = optimizer_of(self.model, cfg)
        self.fsdp2_steps = fsdp2_steps if cfg.dtype == "float32" else 0
        self.fsdp2, self.fsdp2_opt = (None, None)
        if self.fsdp2_steps:
            self.fsdp2, _ = fsdp2_model(cfg, ctx)
            self.fsdp2_opt = sharded_optimizer(self.fsdp2, cfg)
        self.vs_fsdp2: list[float] = []
        self.seconds = 0.0

    def train_step(self, step: int) -> tuple[float, torch.Tensor | None]:
        ctx = self.ctx
        if self.recorder is not None:
            self.recorder.begin()
        trace = self.trace or profiler.StepTrace(None, "", 0, ctx.device, 0)
        t0 = time.perf_counter()
        with trace.step(step, "fsdp-by-hand"):
            loss = train_step(self.model, self.optimizer, step, self.cfg, ctx.rank, ctx.world_size)
        self.seconds += time.perf_counter() - t0
        total = torch.tensor([loss], dtype=torch.float64, device=ctx.device)
        dist.all_reduce(total)
        if step < self.fsdp2_steps:
            with trace.step(step, "fsdp2"):
                train_step(self.fsdp2, self.fsdp2_opt, step, self.cfg, ctx.rank, ctx.world_size)
            self.vs_fsdp2.append(max_difference(ours.full_state_dict(self.model), fsdp2_full(self.fsdp2)))
        written = trace.done_with(step)
        if written is not None and ctx.is_main:  # the report is rank 0's: its trace is read
            self.traced = profiler.summarize(written, ["fsdp-by-hand"])["fsdp-by-hand"]
            launch.log(ctx, f"trace: {profiler.describe(self.traced)}")
        return float(total) / ctx.world_size, getattr(self.optimizer, "last_norm", None)

    def whole_state(self) -> dict:
        return ours.whole_training_state(self.model, self.optimizer)

    def first_step(self) -> proof.FirstStep:
        return proof.data_parallel_first_step(self.model, lambda: ours.full_gradients(self.model), self.cfg, self.ctx)


def train(cfg: TrainConfig, args: argparse.Namespace, ctx: launch.DistContext, check: bool) -> dict:
    """Train our FSDP for ``cfg.steps`` steps; with ``check``, the step drift at every step against one
    process (the harness's twins, clipping with our norm) and FSDP2 beside it (``--fsdp2-steps``)."""
    from tqdm import tqdm

    recorder = ours.Recorder()
    fsdp2_steps = (cfg.steps if args.full else min(args.fsdp2_steps, cfg.steps)) if check else 0
    trace = profiler.StepTrace(args.trace, "lab04", ctx.rank, ctx.device, cfg.steps) if args.trace else None
    system = FSDPSystem(cfg, ctx, args.clip_norm, recorder, fsdp2_steps, trace)
    watch = Watch(system.model, cfg)
    bar = tqdm(
        total=cfg.steps,
        desc=f"[rank 0] train (fsdp by hand, {cfg.dtype})",
        disable=args.quiet or not ctx.is_main,
        dynamic_ncols=True,
        file=sys.stdout,
    )

    def on_step(step: int, loss: float, run: proof.DriftRun) -> None:
        watch.after_step(step, loss)
        bar.update(1)
        if ctx.is_main:
            shown = {"step drift": f"{run.drift.final:.1e}"} if check and run.drift.values else {}
            bar.set_postfix({"loss": f"{loss:.4f}", **shown})

    run = proof.run_with_twin(
        system, cfg, ctx, twin_norm="run", on_step=on_step, check=check, also_own_norm=check and args.full
    )
    bar.close()
    bit_identical = True
    if check:
        digests = [None] * ctx.world_size
        dist.all_gather_object(digests, equivalence.digest(ours.full_state_dict(system.model)))
        bit_identical = len(set(digests)) == 1
    vs_fsdp2 = system.vs_fsdp2
    result = {
        "steps": cfg.steps,
        "dtype": cfg.dtype,
        "final_loss": run.losses[-1],
        "seconds_per_step": system.seconds / cfg.steps,
        "step_drift": run.summary() if check else None,
        "step_drift_own_norm": run.own_norm_drift.summary() if check and args.full else None,
        "ranks_bit_identical": bit_identical if check else None,
        "clip_norm": args.clip_norm,
        "fsdp2_steps": len(vs_fsdp2),
        "max_difference_from_fsdp2": max(vs_fsdp2) if vs_fsdp2 else None,
        "first_step_differing_from_fsdp2": next((i for i, d in enumerate(vs_fsdp2) if d > 0), None),
        "last_step": _step_record(recorder.steps[-1]),
        "trace": system.traced,
    }
    if cfg.dtype == "float32":
        full = build_model(cfg).to(ctx.device)
        full.load_state_dict(ours.full_state_dict(system.model))
        result.update(entry.tutor_score(full, args, cfg.block_size, ctx))
    return result


def _step_record(step) -> dict:
    return {
        "schedule": step.schedule,
        "collectives": step.collectives,
        "bytes_sent": step.bytes_sent(),
        "bytes_by_kind": {k: step.bytes_sent((k,)) for k in ("all-gather", "reduce-scatter", "all-reduce")},
        "peak_held": step.peak_held,
        "timeline": [[round(t, 6), what, unit, held] for t, what, unit, held in step.timeline],
        "completions": [[round(t, 6), unit] for t, unit in step.completions],
    }


def without_clipping(cfg: TrainConfig, ctx: launch.DistContext, steps: int) -> dict:
    """Ours and FSDP2 without gradient clipping, for each precision recipe: the same arithmetic
    in the same order, so the weights must be bit-identical after every step."""
    cfg = replace(cfg, grad_clip=0.0)
    out = {}
    for name, policy in MIXED_PRECISION.items():
        mp = None if policy is None else ours.MixedPrecision(policy.param_dtype, policy.reduce_dtype)
        model = shard_ours(build_model(cfg).to(ctx.device), mp=mp)
        optimizer = optimizer_of(model, cfg)
        fsdp2, _ = fsdp2_model(cfg, ctx, mp=policy)
        fsdp2_opt = sharded_optimizer(fsdp2, cfg)
        diffs = []
        for step in range(steps):
            train_step(model, optimizer, step, cfg, ctx.rank, ctx.world_size)
            train_step(fsdp2, fsdp2_opt, step, cfg, ctx.rank, ctx.world_size)
            diffs.append(max_difference(ours.full_state_dict(model), fsdp2_full(fsdp2)))
        out[name] = {"max_difference": max(diffs), "bit_identical": max(diffs) == 0.0}
    return {"steps": steps, "recipes": out, "bit_identical": all(r["bit_identical"] for r in out.values())}


def norm_orders(cfg: TrainConfig, ctx: launch.DistContext) -> dict:
    """The gradient norm of the first step three ways: ours (one all-reduce of each parameter's
    squared local norm, then the norm of the whole parameters' norms), FSDP2's
    (``clip_grad_norm_``'s own ``get_total_norm`` on its sharded gradients), and the variant with
    one all-reduce of one number (each rank's norm of its pieces' norms, squared)."""
    model = shard_ours(build_model(cfg).to(ctx.device))
    fsdp2, _ = fsdp2_model(cfg, ctx)
    x, y, mask = (
        t.to(ctx.device)
        for t in grammar.get_batch(
            "train", 0, cfg.batch_size, ctx.rank, ctx.world_size, seed=cfg.seed, block_size=cfg.block_size
        )
    )
    model(x, y, mask)[1].backward()
    fsdp2(x, y, mask)[1].backward()
    mine = ours.find_units(model)[0].global_grad_norm(model)
    one_number = global_grad_norm_one_number(model)
    theirs = torch.nn.utils.get_total_norm([p.grad for p in fsdp2.parameters()]).full_tensor()
    return {
        "ours": float(mine),
        "fsdp2": float(theirs),
        "one_number": float(one_number),
        "ours_equals_fsdp2": bool(mine == theirs),
        "parameters": sum(1 for p in fsdp2.parameters() if p.grad is not None),
    }


def traced_fsdp2_step(model, tracer, optimizer, step: int, cfg: TrainConfig, ctx: launch.DistContext) -> None:
    x, y, mask = (
        t.to(ctx.device)
        for t in grammar.get_batch(
            "train", step, cfg.batch_size, ctx.rank, ctx.world_size, seed=cfg.seed, block_size=cfg.block_size
        )
    )
    with tracer, tracer.step(step):
        _, loss = model(x, y, mask)
        tracer.enter_backward()
        loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def orders(cfg: TrainConfig, ctx: launch.DistContext, steps: int = 2) -> dict:
    """For each prefetch setting: our schedule and FSDP2's (Lab 03's tracer), step by step."""
    out = {}
    for setting, variant in SETTINGS.items():
        recorder = ours.Recorder()
        model = shard_ours(build_model(cfg).to(ctx.device), setting, recorder)
        optimizer = optimizer_of(model, cfg)
        fsdp2, blocks = fsdp2_model(cfg, ctx, variant)
        tracer = FSDPTracer(fsdp2, "fsdp2", blocks)
        fsdp2_opt = sharded_optimizer(fsdp2, cfg)
        for step in range(steps):
            recorder.begin()
            train_step(model, optimizer, step, cfg, ctx.rank, ctx.world_size)
            traced_fsdp2_step(fsdp2, tracer, fsdp2_opt, step, cfg, ctx)
        mine = [[e for e in s.schedule if not e.startswith("free ")] for s in recorder.steps]
        theirs = [record.schedule() for record in tracer.steps]
        out[setting] = {
            "fsdp2_variant": variant,
            "schedule": recorder.steps[-1].schedule,
            "fsdp2_schedule": theirs[-1],
            "matches_fsdp2": mine == theirs,
            "bytes_sent": recorder.steps[-1].bytes_sent(),
            "fsdp2_bytes_sent": {k: v for k, v in tracer.steps[-1].summary()["sent_bytes"].items()},
            "peak_held": recorder.steps[-1].peak_held,
            "memory_model": memory_model(cfg, ctx.world_size, setting),
        }
    return out


def mixed_precision(cfg: TrainConfig, ctx: launch.DistContext, steps: int) -> dict:
    """Each recipe of Lab 03 (:data:`MIXED_PRECISION`), ours and FSDP2 from the same weights:
    how far the weights land from one fp32 process, and from each other."""
    probe = equivalence.Probe(build_model(cfg), block_size=cfg.block_size)
    reference = build_model(cfg).to(ctx.device)
    ref_opt = build_optimizer(reference, cfg)
    for step in range(steps):
        train_step(reference, ref_opt, step, cfg)
    out = {}
    for name, policy in MIXED_PRECISION.items():
        mp = None if policy is None else ours.MixedPrecision(policy.param_dtype, policy.reduce_dtype)
        recorder = ours.Recorder()
        model = shard_ours(build_model(cfg).to(ctx.device), recorder=recorder, mp=mp)
        optimizer = optimizer_of(model, cfg)
        fsdp2, _ = fsdp2_model(cfg, ctx, mp=policy)
        fsdp2_opt = sharded_optimizer(fsdp2, cfg)
        for step in range(steps):
            recorder.begin()
            train_step(model, optimizer, step, cfg, ctx.rank, ctx.world_size)
            train_step(fsdp2, fsdp2_opt, step, cfg, ctx.rank, ctx.world_size)
        mine = ours.full_state_dict(model)
        out[name] = {
            "weight_drift": probe.drift(reference, mine),
            "fsdp2_weight_drift": probe.drift(reference, fsdp2_full(fsdp2)),
            "max_difference_from_fsdp2": max_difference(mine, fsdp2_full(fsdp2)),
            "bytes_sent": recorder.steps[-1].bytes_sent(),
            "bytes_model": model_bytes(
                cfg,
                ctx.world_size,
                4 if policy is None else policy.param_dtype.itemsize,
                4 if policy is None else policy.reduce_dtype.itemsize,
            ),
        }
    return {"steps": steps, "recipes": out}


def checkpoint(cfg: TrainConfig, ctx: launch.DistContext, folder: Path) -> dict:
    """Train 3 steps on 2 ranks, save sharded; load on 1 rank and on every rank: the logits."""
    probe = equivalence.probe_batch(block_size=cfg.block_size).to(ctx.device)
    pair = dist.new_group([0, 1])
    alone = dist.new_group([0])
    out: dict = {"saved_at": 2, "loaded_at": {}}
    path = folder / "lab04-sharded"
    saved_logits = None
    if ctx.rank < 2:
        model = shard_ours(build_model(cfg).to(ctx.device), group=pair)
        optimizer = optimizer_of(model, cfg)
        for step in range(3):
            train_step(model, optimizer, step, cfg, ctx.rank, 2)
        ours.save_sharded(model, path, pair)
        with torch.no_grad():
            saved_logits = model(probe)[0]
    dist.barrier()
    loads = [(1, alone if ctx.rank == 0 else None), (ctx.world_size, None)]
    for world, group in loads:
        if world == 1 and ctx.rank != 0:
            continue
        model = shard_ours(build_model(replace(cfg, seed=cfg.seed + 1)).to(ctx.device), group=group)  # other weights
        ours.load_sharded(model, path, group)
        with torch.no_grad():
            logits = model(probe)[0]
        if ctx.rank == 0:
            out["loaded_at"][str(world)] = float((logits - saved_logits).abs().max())
    dist.barrier()
    return out


def speed(cfg: TrainConfig, ctx: launch.DistContext, rounds: int, steps: int) -> dict:
    """Seconds per step, ours and FSDP2, in interleaved rounds (the order alternates)."""
    model = shard_ours(build_model(cfg).to(ctx.device))
    optimizer = optimizer_of(model, cfg)
    fsdp2, _ = fsdp2_model(cfg, ctx)
    fsdp2_opt = sharded_optimizer(fsdp2, cfg)
    runs = {"ours": (model, optimizer), "fsdp2": (fsdp2, fsdp2_opt)}
    times: dict[str, list[float]] = {"ours": [], "fsdp2": []}
    train_step(model, optimizer, 0, cfg, ctx.rank, ctx.world_size)  # warm up both
    train_step(fsdp2, fsdp2_opt, 0, cfg, ctx.rank, ctx.world_size)
    for r in range(rounds):
        for name in ("ours", "fsdp2") if r % 2 == 0 else ("fsdp2", "ours"):
            m, opt = runs[name]
            dist.barrier()
            t0 = time.perf_counter()
            for s in range(steps):
                train_step(m, opt, 1 + s, cfg, ctx.rank, ctx.world_size)
            dist.barrier()
            times[name].append((time.perf_counter() - t0) / steps)
    median = {k: statistics.median(v) for k, v in times.items()}
    return {
        "rounds": rounds,
        "steps_per_round": steps,
        "seconds_per_step": times,
        "median": median,
        "ratio": median["ours"] / median["fsdp2"],
    }


# ----------------------------------------------------------------------------------------------
# The command line


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = cli.torchrun_parser(PROG, __doc__)
    p.add_argument("--steps", type=cli.POSITIVE_INT, default=TrainConfig().steps, help="training steps")
    p.add_argument("--seed", type=cli.SEED, default=0, help="the weights and the batches")
    entry.add_check_flags(p)
    p.add_argument(
        "--fsdp2-steps",
        type=cli.NON_NEGATIVE_INT,
        default=DEFAULT_FSDP2_STEPS,
        help="--check: steps FSDP2 trains beside ours, bit for bit (--full: every step)",
    )
    p.add_argument(
        "--short-steps",
        type=cli.POSITIVE_INT,
        default=DEFAULT_SHORT_STEPS,
        help="--check: steps of the no-clipping and mixed-precision runs",
    )
    p.add_argument(
        "--clip-norm",
        choices=CLIP_NORMS,
        default="per-parameter",
        help="the global gradient norm: one all-reduce of one number per parameter (FSDP2's arithmetic) "
        "or of one number",
    )
    p.add_argument(
        "--rounds",
        type=cli.NON_NEGATIVE_INT,
        default=None,
        help="--check: speed rounds, ours against FSDP2 (default: 5 with --full, else 0: no timing)",
    )
    p.add_argument(
        "--test-sentences",
        type=cli.POSITIVE_INT,
        default=None,
        help="tutor accuracy on this many test sentences (default: all)",
    )
    entry.add_run_flags(p, trace="lab04")
    cli.add_device_flag(p)
    return p.parse_args(argv)


def check_args(args: argparse.Namespace, world_size: int) -> TrainConfig:
    cfg = TrainConfig(steps=args.steps, seed=args.seed)
    cli.divisible_by_world(None, cfg.batch_size, world_size)
    if args.check:
        cli.need_world_size(world_size, 2, "--check compares a sharded run of 2 ranks or more with one process")
    if args.rounds and not args.check:
        raise cli.BadInput(f"--rounds {args.rounds}: the speed rounds are part of --check; add --check")
    return cfg


def measure(cfg: TrainConfig, args: argparse.Namespace, ctx: launch.DistContext) -> dict:
    t_start = time.perf_counter()
    launch.log(
        ctx,
        f"MiniGPT {build_model(cfg).num_params():,} parameters | our FSDP, block policy, world size "
        f"{ctx.world_size} ({ctx.backend}) | {cfg.steps} steps | implementation: {impl.current()}",
    )
    report: dict = {"world_size": ctx.world_size, "implementation": impl.current(), "full": bool(args.full)}
    check = proof.Proof(proof.DATA_PARALLEL, twin_norm="run", report=report)
    parts: dict[str, float] = {}  # where the check's time goes, seconds per part (rank 0's clock)
    mark = [time.perf_counter()]

    def took(part: str) -> None:
        now = time.perf_counter()
        parts[part] = round(now - mark[0], 2)
        mark[0] = now

    if args.check:

        def build(c: TrainConfig) -> FSDPSystem:
            return FSDPSystem(c, ctx, args.clip_norm)

        check.first_step(build, cfg, ctx)
        took("first_step")
        check.float64(build, cfg, ctx, args.fp64_steps)
        took("float64")
        launch.log(
            ctx,
            f"float64: step drift {report['fp64_max_step_drift']:.1e} over {report['fp64_steps']} steps | first step: "
            f"logits {report['fp32_first_step_logit_diff']:.1e}, gradients {report['fp32_first_step_grad_diff']:.1e}",
        )
    report["training"] = train(cfg, args, ctx, args.check)
    took("training")
    t = report["training"]
    report.update(
        tutor_accuracy=t["tutor_accuracy"],
        bytes_per_rank_per_step=t["last_step"]["bytes_sent"],
        bytes_model=model_bytes(cfg, ctx.world_size),
    )
    if args.check:
        check.float32(t["step_drift"])
        report["clipped_steps"] = t["step_drift"]["clipped_steps"]
        if t["step_drift_own_norm"] is not None:
            report["fp32_max_step_drift_twin_own_norm"] = t["step_drift_own_norm"]["max"]
        report["without_clipping"] = without_clipping(cfg, ctx, args.short_steps)
        took("without_clipping")
        report["norms"] = norm_orders(cfg, ctx)
        took("norms")
        report["orders"] = orders(cfg, ctx)
        took("orders")
        report["mixed_precision"] = mixed_precision(cfg, ctx, args.short_steps)
        took("mixed_precision")
        with tempfile.TemporaryDirectory() as tmp:
            shared = [tmp if ctx.is_main else None]
            dist.broadcast_object_list(shared)
            report["checkpoint"] = checkpoint(cfg, ctx, Path(shared[0]))
            dist.barrier()
        took("checkpoint")
        rounds = args.rounds if args.rounds is not None else (5 if args.full else 0)
        if rounds:
            report["speed"] = speed(cfg, ctx, rounds, 10)
            took("speed")
        fsdp2_bytes = report["orders"]["implicit"]["fsdp2_bytes_sent"]
        report.update(
            ranks_bit_identical=t["ranks_bit_identical"],
            bytes_fsdp2=fsdp2_bytes["all-gather"] + fsdp2_bytes["reduce-scatter"],
            event_order_matches_fsdp2=all(o["matches_fsdp2"] for o in report["orders"].values()),
            memory_matches_model=all(o["peak_held"] == o["memory_model"]["peak"] for o in report["orders"].values()),
            pytorch_impl="torch.distributed.fsdp.fully_shard (FSDP2)",
            pytorch_steps=t["fsdp2_steps"],
            pytorch_max_diff=max(
                t["max_difference_from_fsdp2"] or 0.0,
                *(r["max_difference"] for r in report["without_clipping"]["recipes"].values()),
            ),
        )
        report["same_as_pytorch"] = report["pytorch_max_diff"] == 0.0
        report["bit_identical_to_fsdp2"] = report["same_as_pytorch"]
        report.update(verdict(report, args).keys())
    report["seconds_by_part"] = parts
    return entry.finish(report, args, ctx, summary, t_start)


def verdict(report: dict, args: argparse.Namespace) -> proof.Verdict:
    """Lab 04's rulers: the harness's three, then FSDP2's, the bytes, the order, the memory."""
    v = proof.Proof(proof.DATA_PARALLEL, twin_norm="run", report=report).judge()
    steps = f"{report['pytorch_steps']} steps beside ours, and {report['without_clipping']['steps']} without clipping"
    if args.clip_norm == "per-parameter":
        v.true("same_as_pytorch", report["same_as_pytorch"], f"bit-identical weights to FSDP2: {steps}")
    else:  # the one-number norm rounds differently from FSDP2's (the page's lesson)
        v.reported("pytorch_max_diff", report["pytorch_max_diff"], f"the one-number norm against FSDP2's: {steps}")
    v.equal(
        "bytes_per_rank_per_step", report["bytes_per_rank_per_step"], report["bytes_model"], "Lab 02's ZeRO-3 model"
    )
    v.equal("bytes_fsdp2", report["bytes_fsdp2"], report["bytes_model"], "what FSDP2 sent, the same model")
    v.true("event_order_matches_fsdp2", report["event_order_matches_fsdp2"], "four prefetch settings")
    v.true("memory_matches_model", report["memory_matches_model"], "peak of parameters and gradients held")
    v.true(
        "checkpoint_reloads_exactly",
        all(d == 0.0 for d in report["checkpoint"]["loaded_at"].values()),
        "saved on 2 ranks, loaded on 1 and on all: the same logits",
    )
    v.true("ranks_bit_identical", report["ranks_bit_identical"], "the gathered weights on every rank")
    return v


def summary(report: dict) -> list[str]:
    t = report["training"]
    lines = [
        f"final: step {t['steps']} | loss {t['final_loss']:.4f} | tutor accuracy {100 * t['tutor_accuracy']:.1f}% "
        f"({t['tutor_correct']}/{t['tutor_total']}) | bytes per rank per step {report['bytes_per_rank_per_step']:,} "
        f"(model {report['bytes_model']:,})"
    ]
    if report.get("rulers"):
        lines += proof.Verdict.of(report).lines()
    return lines


LAB = entry.Lab(
    PROG,
    parse_args,
    check_args,
    measure,
    "minigpt.pages.lab04:render",
    ("training", "world_size"),
    "lab/results/04-fsdp-cpu.json",
)


def main(argv: list[str] | None = None) -> int:
    return entry.main(LAB, argv)
