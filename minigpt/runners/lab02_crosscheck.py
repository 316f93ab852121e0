"""Lab 02's cross-check: the ZeRO model against real runs of MiniGPT on two processes.

    torchrun --nproc_per_node=2 lab/02_crosscheck.py --report out/lab02.json

Three real ways to train the same MiniGPT, each for ``--steps`` steps from the same seed:

* ``ddp``   Lab 01's hand-rolled bucketed DDP, on its hand-written ring (so the bytes are the
            bytes really passed to send/recv) + AdamW: ZeRO stage 0;
* ``zero1`` :class:`minigpt.parallel.zero1.ZeroOneOptimizer` wrapping AdamW, no DDP: stage 1;
* ``fsdp2`` PyTorch's ``fully_shard`` on every block and on the root + AdamW: stage 3.

For each, every rank measures, per step: the bytes it sent (DDP and ZeRO-1: counted by the ring;
FSDP2: the sizes FSDP2 passed to its all-gathers and reduce-scatters, times the ring factor
(N-1)/N, since gloo's own traffic cannot be seen from Python), the model states it holds right
after the optimizer step (when weights, gradients and optimizer state all exist: a census of
tensor storages, :func:`minigpt.fsdp.memory.model_state_bytes`) and the peak of every tensor
allocated during the step (activations included: :class:`minigpt.fsdp.memory.PeakMemory`). Beside
each measurement it prints what :mod:`minigpt.zero` predicts for the same Ψ and N, and it checks
every step against one process, with Lab 01's rule: the state before the step, loaded into a
single-process MiniGPT + AdamW that takes the same step on the whole batch, must give logits
within 1e-5.

``--sizes 96,192,384`` measures instead when sharding pays: at each width (n_embd) DDP, ZeRO-1, ZeRO-2
(FSDP2 with ``reshard_after_forward=False``) and ZeRO-3 (FSDP2) train side by side, interleaved;
each rank's bytes and model states at three points of a step are held against
:mod:`minigpt.zero.exact` to the byte, beside the peak of all tensors and the median seconds per step.
"""

from __future__ import annotations

import argparse
import gc
import time
from dataclasses import dataclass, field, replace

import torch
import torch.distributed as dist

from minigpt import cli
from minigpt.divergence import Watch
from minigpt.fsdp.variants import fsdp2_unit_sizes
from minigpt.parallel import bounds, equivalence, launch, proof
from minigpt.runners import entry
from minigpt.train import TrainConfig, build_model, build_optimizer, train_step
from minigpt.zero import comm, memory

PROG = "lab/02_crosscheck.py"
VARIANTS = ("ddp", "zero1", "fsdp2")
STAGE_OF = {"ddp": 0, "zero1": 1, "fsdp2": 3}


@dataclass
class Run:
    """One variant: the module its steps run through, its parameters' owner, its optimizer."""

    name: str
    model: torch.nn.Module  # the MiniGPT whose parameters are trained
    wrapped: torch.nn.Module  # what forward is called on
    optimizer: torch.optim.Optimizer
    drift: equivalence.DriftLog = field(default_factory=equivalence.DriftLog)
    sent_per_step: list[int] = field(default_factory=list)
    states_after_step: dict = field(default_factory=dict)
    peak_step_bytes: int = 0
    seconds: float = 0.0


def zero1_param_groups(model: torch.nn.Module, cfg: TrainConfig) -> list[dict]:
    """The same groups as :func:`minigpt.train.build_optimizer` (weight decay on matrices only)."""
    params = [p for p in model.parameters() if p.requires_grad]
    return [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": cfg.weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]


def build(name: str, cfg: TrainConfig, ctx: launch.DistContext) -> Run:
    model = build_model(cfg).to(ctx.device)
    if name == "ddp":
        from minigpt.parallel.ddp import BucketedDDP

        wrapped = BucketedDDP(model, bucket_cap_mb=0.5, collective="ring")
        return Run(name, model, wrapped, build_optimizer(model, cfg))
    if name == "zero1":
        from minigpt.parallel.zero1 import ZeroOneOptimizer

        optimizer = ZeroOneOptimizer(zero1_param_groups(model, cfg), torch.optim.AdamW, lr=cfg.lr, betas=(0.9, 0.95))
        return Run(name, model, model, optimizer)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    # the mesh on this rank's device: without one, FSDP2 takes the machine's accelerator, a GPU
    # even for a run that the device decision put on the CPU
    mesh = init_device_mesh(ctx.device.type, (ctx.world_size,))
    # FSDP2's default reshards every block after forward, never the root (backward needs it first);
    # "fsdp2-no-reshard" keeps every unit gathered from its forward to its backward: ZeRO-2
    options = {"reshard_after_forward": False} if name == "fsdp2-no-reshard" else {}
    for block in model.blocks:
        fully_shard(block, mesh=mesh, **options)
    fully_shard(model, mesh=mesh, **options)
    return Run(name, model, model, build_optimizer(model, cfg))


def bytes_sent(run: Run, counter) -> int:
    if run.name == "ddp":
        return run.wrapped.ring_bytes.sent
    if run.name == "zero1":
        return run.optimizer.counter.sent
    n = dist.get_world_size()
    s = counter.summary()
    return round((n - 1) / n * (s["all_gather_bytes"] + s["reduce_scatter_bytes"]))


def reset_bytes(run: Run) -> None:
    if run.name == "ddp":
        run.wrapped.ring_bytes.reset()
    elif run.name == "zero1":
        run.optimizer.counter.reset()


def census(run: Run) -> dict:
    from minigpt.fsdp.memory import model_state_bytes

    if run.name == "ddp":
        return model_state_bytes(run.model, run.optimizer, extra=[b.buffer for b in run.wrapped.buckets])
    if run.name == "zero1":
        return model_state_bytes(run.model, run.optimizer.local)
    return model_state_bytes(run.model, run.optimizer)


class CrossSystem:
    """One variant as the proof harness sees it, measured as it trains: the bytes it sends, the model
    states after the optimizer step, the peak of every tensor during the step."""

    def __init__(self, name: str, cfg: TrainConfig, ctx: launch.DistContext):
        from minigpt.fsdp.practice import CollectiveCounter

        self.cfg, self.ctx, self.counter_class = cfg, ctx, CollectiveCounter
        self.run = run = build(name, cfg, ctx)
        self.watch = Watch(run.model, cfg)  # nan or inf: the step, the value, the setting to look at
        run.optimizer.register_step_post_hook(lambda *_: run.states_after_step.update(census(run)))
        # ZeRO-1 clips its shards by the whole norm (its own clip_grad_norm_); the others as one process
        clip = run.optimizer.clip_grad_norm_ if name == "zero1" else None
        self.norm = (
            proof.clip_capture(run.optimizer, clip) if clip else proof.run_norm_capture(run.model, run.optimizer)
        )

    def train_step(self, step: int) -> tuple[float, torch.Tensor | None]:
        from minigpt.fsdp.memory import PeakMemory

        run, ctx = self.run, self.ctx
        reset_bytes(run)
        t0 = time.perf_counter()
        with self.counter_class() as counter, PeakMemory(ctx.device) as peak:
            loss = train_step(run.wrapped, run.optimizer, step, self.cfg, ctx.rank, ctx.world_size)
        run.seconds += time.perf_counter() - t0
        # this rank's loss; a nan anywhere reaches every rank's weights through the averaged gradient
        self.watch.after_step(step, loss)
        run.sent_per_step.append(bytes_sent(run, counter))
        run.peak_step_bytes = max(run.peak_step_bytes, peak.peak_bytes)
        total = torch.tensor([loss], dtype=torch.float64, device=ctx.device)
        dist.all_reduce(total)
        return float(total) / ctx.world_size, self.norm()

    def whole_state(self) -> dict:
        run = self.run
        if run.name != "zero1":
            return proof.plain_state(run.model, run.optimizer)
        scratch = build_model(self.cfg).to(self.ctx.device)  # ZeRO-1's shards, gathered into one AdamW
        optimizer = build_optimizer(scratch, self.cfg)
        run.optimizer.load_into(optimizer)
        state = proof.plain_state(scratch, optimizer)
        state["weights"] = {n: v.detach().clone() for n, v in run.model.state_dict().items()}
        return state

    def first_step(self) -> proof.FirstStep:
        # ZeRO-1 keeps only its shard of the averaged gradient: its first step shows the logits; the
        # float64 ruler holds its whole step
        run = self.run
        grads = (lambda: {}) if run.name == "zero1" else (lambda: proof.named_grads(run.model))
        return proof.data_parallel_first_step(run.wrapped, grads, self.cfg, self.ctx)


def zero_redundancy(cfg: TrainConfig, ctx: launch.DistContext, steps: int) -> dict:
    """Our ZeRO-1 against PyTorch's ``ZeroRedundancyOptimizer`` (with ``DistributedDataParallel``, which
    it needs for the averaged gradient), from the same weights, ``steps`` steps side by side: without
    clipping the arithmetic is the same and the weights must be bit-identical; with clipping the
    two global norms round differently (ours sums the squares of its shard, PyTorch's takes each
    parameter's norm), so they are within a bound."""
    from torch.distributed.optim import ZeroRedundancyOptimizer
    from torch.nn.parallel import DistributedDataParallel

    from minigpt.parallel.zero1 import ZeroOneOptimizer

    out = {}
    for name, clip in (("without_clipping", 0.0), ("with_clipping", cfg.grad_clip)):
        c = replace(cfg, grad_clip=clip)
        ours = build_model(c).to(ctx.device)
        our_opt = ZeroOneOptimizer(zero1_param_groups(ours, c), torch.optim.AdamW, lr=c.lr, betas=(0.9, 0.95))
        theirs = build_model(c).to(ctx.device)
        groups = zero1_param_groups(theirs, c)
        their_opt = ZeroRedundancyOptimizer(
            groups[0]["params"],
            optimizer_class=torch.optim.AdamW,
            lr=c.lr,
            betas=(0.9, 0.95),
            weight_decay=groups[0]["weight_decay"],
        )
        their_opt.add_param_group(groups[1])
        wrapped = DistributedDataParallel(theirs)
        diffs = []
        for step in range(steps):
            train_step(ours, our_opt, step, c, ctx.rank, ctx.world_size)
            train_step(wrapped, their_opt, step, c, ctx.rank, ctx.world_size)
            diffs.append(
                max(
                    float((a.detach() - b.detach()).abs().max()) for a, b in zip(ours.parameters(), theirs.parameters())
                )
            )
        out[name] = {"steps": steps, "max_difference": max(diffs), "bit_identical": max(diffs) == 0.0}
    return out


# --- what the model predicts -------------------------------------------------------------------


def prediction(name: str, psi: int, model: torch.nn.Module, world_size: int) -> dict:
    """What Lab 02's model says for this variant (fp32 recipe: 4 + 4 + 8 bytes per parameter)."""
    stage = STAGE_OF[name]
    out = {"stage": stage}
    if name == "fsdp2":
        plain, padded = fsdp2_unit_sizes(model, world_size)
        reshard = [False] + [True] * (len(plain) - 1)  # FSDP2 keeps the root gathered for backward
        out["bytes"] = sum(c.bytes_sent for c in comm.unit_collectives(padded, 3, world_size, 4, 4, reshard, pad=False))
        out["bytes_unpadded"] = sum(
            c.bytes_sent for c in comm.unit_collectives(plain, 3, world_size, 4, 4, reshard, pad=False)
        )
        out["padding_elements"] = sum(padded) - sum(plain)
        out["model_states"] = memory.device_memory(sum(padded), world_size, 3, "fp32").device
        return out
    out["bytes"] = comm.bytes_per_step(psi, stage, world_size, "fp32")
    # (Lab 01's DDP keeps its gradients as views of its buckets: the buckets are the 4Ψ of gradients)
    out["model_states"] = memory.device_memory(psi, world_size, stage, "fp32").device
    return out


def summarize(run: Run, psi: int, ctx: launch.DistContext) -> dict:
    pred = prediction(run.name, psi, run.model, ctx.world_size)
    measured_states = run.states_after_step["total"]
    predicted_states = pred["model_states"]
    sent = run.sent_per_step[-1]
    return {
        "stage": pred["stage"],
        "prediction": pred,
        "bytes_sent_per_step": sent,
        "bytes_constant_over_steps": len(set(run.sent_per_step)) == 1,
        "bytes_relative_difference": (sent - pred["bytes"]) / pred["bytes"],
        "model_states_after_step": run.states_after_step,
        "model_states_relative_difference": (measured_states - predicted_states) / predicted_states,
        "peak_bytes_during_step": run.peak_step_bytes,
        "step_drift": run.drift.summary(),
        "seconds_per_step": run.seconds / max(1, len(run.sent_per_step)),
    }


# --- when sharding pays: every stage at several widths (--sizes) ------------------------------

SIZES = (96, 192, 384)  # n_embd: MiniGPT's own, twice and four times as wide (Ψ grows about 4x each)
STAGE_RUNS = {"ddp": 0, "zero1": 1, "fsdp2-no-reshard": 2, "fsdp2": 3}  # the run that stands for each stage
TIMING_FROM = 2  # step 0 makes the optimizer state, step 1 is measured (census, peak); the rest are timed


class StageRun:
    """One stage's run at one width, measured as it trains: the bytes of every step, the census of
    its model states at three points of step 1 (:data:`minigpt.zero.exact.POINTS`), the peak of every
    tensor that step allocates, and the seconds of each later step (no profiler, no census)."""

    def __init__(self, name: str, cfg: TrainConfig, ctx: launch.DistContext):
        from minigpt.fsdp.practice import CollectiveCounter

        self.cfg, self.ctx, self.counter_class = cfg, ctx, CollectiveCounter
        self.run = run = build(name, cfg, ctx)
        self.census: dict[str, dict] = {}
        self.censusing = False
        self.seconds: list[float] = []
        self.peak_allocated = 0
        run.model.register_forward_hook(lambda *_: self._take("end_of_forward"))
        run.optimizer.register_step_post_hook(lambda *_: self._take("after_step"))

    def _take(self, point: str) -> None:
        if self.censusing:
            self.census[point] = census(self.run)

    def step(self, step: int) -> None:
        from minigpt.fsdp.memory import PeakMemory

        run, ctx = self.run, self.ctx
        reset_bytes(run)
        with self.counter_class() as counter:
            if step == TIMING_FROM - 1:
                self.censusing = True
                self._take("start")
                with PeakMemory(ctx.device) as peak:
                    train_step(run.wrapped, run.optimizer, step, self.cfg, ctx.rank, ctx.world_size)
                self.censusing = False
                self.peak_allocated = peak.peak_bytes
            else:
                t0 = time.perf_counter()
                train_step(run.wrapped, run.optimizer, step, self.cfg, ctx.rank, ctx.world_size)
                if step >= TIMING_FROM:
                    self.seconds.append(time.perf_counter() - t0)
        run.sent_per_step.append(bytes_sent(run, counter))

    def summary(self, predicted: dict) -> dict:
        import statistics

        from minigpt.zero.exact import POINTS

        sent = self.run.sent_per_step
        held = {point: self.census[point]["total"] for point in POINTS}
        constant = len(set(sent)) == 1
        return {
            "stage": STAGE_RUNS[self.run.name],
            "prediction": predicted,
            "bytes_sent_per_step": sent[-1],
            "bytes_constant_over_steps": constant,
            "model_states": held,
            "model_states_by_kind": self.census,
            "exact": constant and sent[-1] == predicted["bytes"] and all(held[p] == predicted[p] for p in POINTS),
            # what the step allocates on top of what it starts with: activations, gathered weights, ...
            "peak_all_tensors": held["start"] + self.peak_allocated,
            "seconds_per_step": statistics.median(self.seconds),
            "seconds_each_step": self.seconds,
        }


def exact_prediction(name: str, cfg: TrainConfig, world_size: int, rank: int) -> dict:
    """:func:`minigpt.zero.exact.per_rank` for MiniGPT at ``cfg``'s width: its parameters' shapes,
    and which FSDP2 unit each is in (0 the root, then the blocks)."""
    from minigpt.zero import exact

    model = build_model(cfg)
    unit_of = {id(p): i + 1 for i, block in enumerate(model.blocks) for p in block.parameters()}
    params = list(model.parameters())
    shapes = [tuple(p.shape) for p in params]
    return exact.per_rank(STAGE_RUNS[name], shapes, [unit_of.get(id(p), 0) for p in params], world_size, rank)


def sharding_pays(sizes: list[int], cfg: TrainConfig, args: argparse.Namespace, ctx: launch.DistContext) -> dict:
    """Each width in turn: the four runs built side by side and trained ``--steps`` steps interleaved
    (step s of every run, in an order that rotates, then step s + 1), so that a slow moment of the
    machine falls on every run alike. No proofs: the default check holds these runs against one
    process at MiniGPT's width; here every byte is held against :mod:`minigpt.zero.exact`."""
    t_start = time.perf_counter()
    names = list(STAGE_RUNS)
    results = {}
    for n_embd in sizes:
        c = replace(cfg, n_embd=n_embd)
        runs = {name: StageRun(name, c, ctx) for name in names}
        for step in range(args.steps):
            for name in names[step % len(names) :] + names[: step % len(names)]:
                runs[name].step(step)
        stages = {name: r.summary(exact_prediction(name, c, ctx.world_size, ctx.rank)) for name, r in runs.items()}
        del runs  # no FSDP2 module may outlive the process group (their hooks hold them in cycles)
        gc.collect()
        results[str(n_embd)] = {"n_embd": n_embd, "params": build_model(c).num_params(), "stages": stages}
        launch.log(
            ctx,
            f"n_embd {n_embd}: "
            + ", ".join(f"{k} {v['seconds_per_step'] * 1e3:.0f} ms/step" for k, v in stages.items())
            + ("" if all(v["exact"] for v in stages.values()) else "; NOT the model's bytes"),
        )
    every = [None] * ctx.world_size  # each rank's own census, held against its own prediction
    dist.all_gather_object(every, {d: {k: v["exact"] for k, v in r["stages"].items()} for d, r in results.items()})
    report = {
        "mode": "sharding-pays",
        "world_size": ctx.world_size,
        "steps": args.steps,
        "timed_steps": args.steps - TIMING_FROM,
        "seed": args.seed,
        "variants": names,
        "sizes": results,
        "exact_per_rank": every,
        "criterion": "on every rank, every byte sent and held equals minigpt.zero.exact's prediction",
        "criterion_pass": all(all(r.values()) for rank in every for r in rank.values()),
    }
    return entry.finish(report, args, ctx, sharding_lines, t_start)


def sharding_lines(report: dict) -> list[str]:
    from minigpt.pages.lab02_sharding import console_table

    return console_table(report).splitlines()


# --- the command line --------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = cli.ArgumentParser(
        prog=PROG,
        description="Lab 02: the ZeRO model against real runs "
        "(hand-rolled DDP, a ZeRO-1 optimizer, FSDP2) on gloo or NCCL.",
        formatter_class=cli.HelpFormatter,
        epilog=cli.TORCHRUN_EPILOG,
    )
    p.add_argument("--steps", type=cli.POSITIVE_INT, default=20, help="steps per variant")
    p.add_argument("--variants", default=",".join(VARIANTS), help=f"comma list of {', '.join(VARIANTS)}")
    p.add_argument("--no-check", action="store_true", help="skip the proofs (one process, PyTorch's ZeRO-1)")
    p.add_argument(
        "--fp64-steps",
        type=cli.POSITIVE_INT,
        default=proof.FP64_MIN_STEPS,
        help=f"steps of the float64 run (at least {proof.FP64_MIN_STEPS})",
    )
    p.add_argument("--seed", type=cli.SEED, default=0, help="the weights and batches of every variant")
    entry.add_run_flags(p, quiet=False, learner_code=False)
    p.add_argument(
        "--sizes",
        metavar="LIST",
        help=f"instead of the check: DDP and ZeRO-1/2/3 at these widths (n_embd, a comma list of "
        f"{', '.join(map(str, SIZES))}), bytes and memory against the model, seconds per step "
        f"(at least {TIMING_FROM + 1} --steps)",
    )
    cli.add_device_flag(p)
    return p.parse_args(argv)


def check_sizes(args: argparse.Namespace) -> list[int]:
    """``--sizes``: the widths, or :class:`minigpt.cli.BadInput` naming the value and what is valid."""
    valid = ", ".join(map(str, SIZES))
    words = [w.strip() for w in args.sizes.split(",") if w.strip()]
    if not words:
        raise cli.BadInput(f"--sizes {args.sizes!r}: empty; give a comma list of n_embd from {valid}")
    for w in words:
        if w not in map(str, SIZES):
            raise cli.BadInput(f"--sizes {args.sizes}: unknown size {w!r}; choose n_embd from {valid}")
    if len(set(words)) != len(words):
        raise cli.BadInput(f"--sizes {args.sizes}: a size is given twice; give each of {valid} at most once")
    if args.variants != ",".join(VARIANTS):
        raise cli.BadInput(f"--variants {args.variants} with --sizes: --sizes runs {', '.join(STAGE_RUNS)}; drop one")
    if args.steps <= TIMING_FROM:
        raise cli.BadInput(
            f"--steps {args.steps} with --sizes: one step makes the optimizer state, one is measured, "
            f"the rest are timed; give at least {TIMING_FROM + 1}"
        )
    return [int(w) for w in words]


def check_args(args: argparse.Namespace, world_size: int) -> tuple[list, TrainConfig]:
    """The variants (or, with ``--sizes``, the widths) and the config, or ValueError naming the value
    that cannot work (the numbers were checked by their rules when parsed; the world size here,
    before any group)."""
    cfg = TrainConfig(seed=args.seed, steps=max(args.steps, 1))
    if args.sizes is not None:
        cli.divisible_by_world(None, cfg.batch_size, world_size)
        return check_sizes(args), cfg
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    for v in variants:
        if v not in VARIANTS:
            raise cli.BadInput(f"--variants {args.variants}: unknown variant {v!r}; choose from {', '.join(VARIANTS)}")
    if not variants:
        raise cli.BadInput(f"--variants {args.variants!r}: empty; choose from {', '.join(VARIANTS)}")
    cli.divisible_by_world(None, cfg.batch_size, world_size)
    return variants, cfg


def measure(variants: list[str], cfg: TrainConfig, args: argparse.Namespace, ctx: launch.DistContext) -> dict:
    """Train and measure each variant in turn, each against one process (the harness's twins), then
    the rulers. The models live and die in here: none of them (nor the collectives FSDP keeps in
    its modules) may outlive the process group, or gloo's threads can abort the process at exit."""
    t_start = time.perf_counter()
    check = not args.no_check
    psi = build_model(cfg).num_params()
    results, rulers = {}, {}
    for name in variants:
        proofs = proof.Proof(proof.DATA_PARALLEL, twin_norm="run")
        if check:
            proofs.first_step(lambda c, name=name: CrossSystem(name, c, ctx), cfg, ctx)
            if name != "fsdp2":  # FSDP2 is PyTorch's own: the algorithm ruler is for ours
                proofs.float64(lambda c, name=name: CrossSystem(name, c, ctx), cfg, ctx, args.fp64_steps)
        system = CrossSystem(name, cfg, ctx)
        drift = proof.run_with_twin(system, cfg, ctx, twin_norm="run", check=check, steps=args.steps)
        system.run.drift = drift.drift
        if check:
            proofs.float32(drift)
        results[name] = summarize(system.run, psi, ctx)
        rulers[name] = proofs.report
        launch.log(
            ctx,
            f"{name}: {results[name]['bytes_sent_per_step']:,} bytes/step "
            f"(model {results[name]['prediction']['bytes']:,.0f})"
            + (f", step drift {results[name]['step_drift']['max']:.2e}" if check else ""),
        )
    report = {
        "world_size": ctx.world_size,
        "params": psi,
        "steps": args.steps,
        "seed": args.seed,
        "variants": results,
    }
    # every rank's own numbers: the report keeps rank 0's and says whether the others agree
    every = [None] * ctx.world_size
    dist.all_gather_object(
        every, {k: (r["bytes_sent_per_step"], r["model_states_after_step"]["total"]) for k, r in results.items()}
    )
    report["per_rank"] = every
    if check:
        report.update(proof.combined(list(rulers.values())), rulers_per_variant=rulers)
        if "zero1" in variants:
            report["zero_redundancy"] = zero_redundancy(cfg, ctx, args.steps)
            z = report["zero_redundancy"]
            report.update(
                pytorch_impl="torch.distributed.optim.ZeroRedundancyOptimizer (with DistributedDataParallel)",
                pytorch_max_diff=z["with_clipping"]["max_difference"],
                same_as_pytorch=z["without_clipping"]["bit_identical"]
                and z["with_clipping"]["max_difference"] <= bounds.PYTORCH_ZERO1_BOUND,
            )
        else:
            report.update(pytorch_impl=None, pytorch_impl_reason="ZeRO-1 not among --variants", same_as_pytorch=None)
        v = proof.Proof(proof.DATA_PARALLEL, twin_norm="run", report=report).judge()
        if "zero_redundancy" in report:
            z = report["zero_redundancy"]
            v.true(
                "same_as_pytorch",
                report["same_as_pytorch"],
                f"ZeRO-1: bit-identical without clipping, within {bounds.PYTORCH_ZERO1_BOUND:g} with, {args.steps} steps",
            )
        for name, r in results.items():
            v.true(f"{name}.bytes_constant_over_steps", r["bytes_constant_over_steps"], "every step sends the same")
        report.update(v.keys())
    return entry.finish(report, args, ctx, lines_of, t_start)


def lines_of(report: dict) -> list[str]:
    from minigpt.pages.lab02_crosscheck import console_table

    lines = console_table(report).splitlines()
    if report.get("rulers"):
        lines += proof.Verdict.of(report).lines()
    return [line.removeprefix("[rank 0] ") for line in lines]


LAB = entry.Lab(
    PROG,
    parse_args,
    check_args,
    lambda settings, args, ctx: (sharding_pays if args.sizes else measure)(settings[0], settings[1], args, ctx),
    "minigpt.pages.lab02_crosscheck:render_files",
    ("variants", "world_size"),
    "lab/results/02-crosscheck-cpu.json",
)


def main(argv: list[str] | None = None) -> int:
    return entry.main(LAB, argv)
