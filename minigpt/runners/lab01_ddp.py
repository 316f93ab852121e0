"""Lab 01's trainer: MiniGPT on the tutor task with the hand-rolled :class:`BucketedDDP`.

    torchrun --nproc_per_node=2 lab/01_ddp.py            # train, report the tutor accuracy
    torchrun --nproc_per_node=2 lab/01_ddp.py --check    # ... and prove it equals one process

Every rank builds the same model from ``--seed``, wraps it, and trains on its slice of each
global batch (:func:`minigpt.grammar.get_batch` with its rank). gloo on CPU, NCCL when there is a
GPU. Only rank 0 prints progress; errors name their rank; a peer that dies ends the others within
``--timeout`` seconds.

``--check`` trains three data-parallel variants in lockstep from the same weights: the bucketed
DDP with ``torch.distributed.all_reduce`` ("bucketed"), the same with the ring collectives of
:mod:`minigpt.parallel.ring` ("ring"), and PyTorch's own ``DistributedDataParallel`` ("torch-ddp").
After every step it measures, for each (see :mod:`minigpt.parallel.equivalence`): the step drift
against one process taking the same step from the same state on the whole batch (criterion:
<= 1e-5) and against one process accumulating the same micro-batches (criterion: <= 1e-5; on two
ranks it must even be bit-identical), the trajectory drift against an independent single-process
run, and whether all ranks hold bit-identical parameters. The single-process work is shared out
between the ranks (:class:`Check`).
"""

from __future__ import annotations

import argparse
import copy
import sys
import time
from dataclasses import fields, replace

import torch
import torch.distributed as dist

from minigpt import cli, impl, profiler
from minigpt.divergence import Watch
from minigpt.parallel import bounds, equivalence, launch, proof
from minigpt.runners import entry
from minigpt.train import (
    DTYPES,
    HELP as train_help,
    OPTIMIZERS,
    RULES,
    TrainConfig,
    build_model,
    build_optimizer,
    train_step,
    validate,
)

VARIANTS = ("bucketed", "ring", "torch-ddp")
DEFAULT_DDP_STEPS = 50  # --check: PyTorch's DDP beside ours for these steps (--full: every step)
DEFAULT_BUCKET_CAP_MB = 0.5  # MiniGPT's 2 MB of float32 gradients -> 4 buckets
PROG = "lab/01_ddp.py"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    defaults = TrainConfig()
    p = cli.torchrun_parser(PROG, __doc__)
    for f in fields(TrainConfig):
        if f.name in ("eval_every", "eval_sentences", "accum"):
            continue
        kwargs = {
            "type": RULES.get(f.name, type(getattr(defaults, f.name))),
            "default": getattr(defaults, f.name),
            "help": train_help[f.name],
        }
        if f.name == "optimizer":
            kwargs["choices"] = OPTIMIZERS
        if f.name == "dtype":
            kwargs["choices"] = tuple(DTYPES)
        p.add_argument("--" + f.name.replace("_", "-"), **kwargs)
    p.add_argument(
        "--accum",
        type=cli.POSITIVE_INT,
        default=1,
        help="micro-batches per step on each rank (all but the last run under no_sync)",
    )
    p.add_argument(
        "--bucket-cap-mb",
        type=cli.MIB,
        default=DEFAULT_BUCKET_CAP_MB,
        help="bucket size in MiB (the gradients' bytes per all-reduce)",
    )
    p.add_argument(
        "--collective",
        choices=("torch", "ring"),
        default="torch",
        help="what reduces the buckets of the main run: torch.distributed.all_reduce or the ring",
    )
    entry.add_check_flags(p)
    p.add_argument(
        "--ddp-steps",
        type=cli.NON_NEGATIVE_INT,
        default=DEFAULT_DDP_STEPS,
        help="--check: steps PyTorch's DDP trains beside ours, bit for bit (--full: every step, and the ring too)",
    )
    p.add_argument(
        "--test-sentences",
        type=cli.POSITIVE_INT,
        default=None,
        help="score the tutor on the first N held-out test sentences (default: all 1209)",
    )
    entry.add_run_flags(p, trace="lab01")
    cli.add_device_flag(p)
    return p.parse_args(argv)


def check_args(args: argparse.Namespace, world_size: int) -> TrainConfig:
    """The config, or ValueError naming the first value that cannot work (before any rank
    joins the group, so every rank stops at once with the same message). Each number was checked
    by its rule when it was parsed (``type=``); here the values are checked together."""
    cfg = TrainConfig(
        **{f.name: getattr(args, f.name) for f in fields(TrainConfig) if f.name not in ("eval_every", "eval_sentences")}
    )
    validate(cfg)
    cli.divisible_by_world("--batch-size", cfg.batch_size, world_size)
    if (cfg.batch_size // world_size) % cfg.accum:
        raise cli.BadInput(
            f"--accum {cfg.accum}: each rank's {cfg.batch_size // world_size} rows (--batch-size "
            f"{cfg.batch_size} over {world_size} ranks) cannot be cut into {cfg.accum} equal micro-batches; "
            f"give an --accum that divides {cfg.batch_size // world_size}"
        )
    return cfg


def wrap(variant: str, model: torch.nn.Module, args: argparse.Namespace, ctx: launch.DistContext):
    if variant == "torch-ddp":
        from torch.nn.parallel import DistributedDataParallel

        return DistributedDataParallel(
            model, bucket_cap_mb=args.bucket_cap_mb, device_ids=[ctx.device] if ctx.device.type == "cuda" else None
        )
    BucketedDDP = impl.load("lab01_ddp", "BucketedDDP")
    return BucketedDDP(model, bucket_cap_mb=args.bucket_cap_mb, collective="ring" if variant == "ring" else "torch")


class Run:
    """One data-parallel variant: its model, wrapper, optimizer and what was measured."""

    def __init__(self, variant: str, cfg: TrainConfig, args: argparse.Namespace, ctx: launch.DistContext):
        self.variant = variant
        self.model = build_model(cfg).to(ctx.device)
        self.wrapped = wrap(variant, self.model, args, ctx)
        self.optimizer = build_optimizer(self.model, cfg)
        self.last_norm = proof.run_norm_capture(self.model, self.optimizer)
        self.step_drift = equivalence.DriftLog()  # against one process, whole batch
        self.float32_probe_drift = equivalence.DriftLog()  # the same, the probe's forward in float32
        self.micro_drift = equivalence.DriftLog()  # against one process, the same micro-batches
        self.micro_bit_identical = True  # ... and bit-identical to it after every step
        self.trajectory_drift = equivalence.DriftLog()
        self.bit_identical = True
        self.seconds = 0.0


class DDPSystem:
    """One variant as the proof harness sees it (:class:`minigpt.parallel.proof.System`): the float64
    ruler's run and the first step."""

    def __init__(self, variant: str, cfg: TrainConfig, args: argparse.Namespace, ctx: launch.DistContext):
        self.run, self.cfg, self.ctx = Run(variant, cfg, args, ctx), cfg, ctx

    def train_step(self, step: int) -> tuple[float, torch.Tensor | None]:
        run, ctx = self.run, self.ctx
        loss = train_step(run.wrapped, run.optimizer, step, self.cfg, ctx.rank, ctx.world_size)
        total = torch.tensor([loss], dtype=torch.float64, device=ctx.device)
        dist.all_reduce(total)
        return float(total) / ctx.world_size, run.last_norm()

    def whole_state(self) -> dict:
        return proof.plain_state(self.run.model, self.run.optimizer)

    def first_step(self) -> proof.FirstStep:
        # the gradients are averaged over the ranks when backward returns
        return proof.data_parallel_first_step(
            self.run.wrapped, lambda: proof.named_grads(self.run.model), self.cfg, self.ctx
        )


class Check:
    """``--check``: after every step, the main variant against one process, and PyTorch's DDP (with
    ``--full`` also the other collective) against the main variant.

    Per step there are two twins (:class:`~minigpt.parallel.proof.SharedTwins`), both from the main
    variant's state before the step: the step on the whole batch (the step drift, the course's
    criterion) and the step accumulating the ranks' micro-batches (what DDP itself controls: on two
    ranks it must be bit-identical, so its probe only runs when the bits differ), each step's two
    twins on two ranks. With ``--full``, also the whole-batch drift measured with a float32 probe, and
    one process's independent trajectory (rank 0 takes its steps at the end of each window).

    The other variants train in lockstep from the same weights for their first ``companion_steps``
    steps and are compared with the main variant after each. On two ranks they stay bit-identical
    (``a + b`` is ``b + a``, and halving is exact). From three ranks on, the ring adds in another
    order than gloo and PyTorch multiplies by 1/N where ours divides by N: a variant that differs is
    given the main variant's state before the next step, so that each step's difference is measured
    from the same start (a difference left to grow would measure chaos).
    """

    def __init__(
        self, runs: list[Run], main: int, cfg: TrainConfig, ctx: launch.DistContext, full: bool, companion_steps: int
    ):
        self.runs, self.main, self.cfg, self.ctx, self.full = runs, main, cfg, ctx, full
        self.companion_steps = companion_steps
        also = None
        if full:
            float32_model = build_model(cfg).to(ctx.device)

            def also(model: torch.nn.Module, after: dict) -> float:
                float32_model.load_state_dict(after)
                return equivalence.logit_drift(model, float32_model, self.whole.twin.probe.tokens)

        self.whole = proof.SharedTwins(cfg, ctx, "own", also=also)
        micro_cfg = replace(cfg, accum=cfg.accum * ctx.world_size)
        self.micro = proof.SharedTwins(micro_cfg, ctx, "own", offset=1, same_bits=True)
        self.whole_run, self.micro_run = proof.DriftRun(), proof.DriftRun()
        main_run = runs[main]  # its logs are the twins' (read by the progress bar and the report)
        main_run.step_drift, main_run.micro_drift = self.whole_run.drift, self.micro_run.drift
        main_run.float32_probe_drift = self.whole_run.also
        self.trajectory = None
        if full and ctx.rank == 0:
            model = build_model(cfg).to(ctx.device)
            self.trajectory = (model, build_optimizer(model, cfg))
        self.trajectory_steps: list[tuple[int, dict]] = []  # (step, the main variant's weights)
        self.before: dict | None = None
        self.max_diff = [0.0] * len(runs)  # each variant's largest weight difference from the main one
        self.bit_identical_to_main = [True] * len(runs)
        self.compared_steps = 0

    def companions(self, step: int) -> list[Run]:
        """The runs that take ``step``: the main one, and the others for their first steps."""
        if step < self.companion_steps:
            return self.runs
        return [self.runs[self.main]]

    def before_step(self, step: int) -> None:
        """Before the variants step: keep the main variant's state if this rank owns one of its twins,
        and give a variant that differs from the main one the main one's state."""
        main = self.runs[self.main]
        if self.whole.owns(step) or self.micro.owns(step):
            self.before = proof.plain_state(main.model, main.optimizer)
        if step < self.companion_steps:
            digest = equivalence.params_digest(main.model)
            for run in self.runs:
                if run is not main and equivalence.params_digest(run.model) != digest:
                    run.model.load_state_dict(main.model.state_dict())
                    run.optimizer.load_state_dict(copy.deepcopy(main.optimizer.state_dict()))

    def after_step(self, step: int) -> None:
        """Keep this rank's twins of ``step``; at the end of a window (or of the run) compute them."""
        main = self.runs[self.main]
        after = {"weights": {n: v.detach().clone() for n, v in main.model.state_dict().items()}}
        digest = equivalence.params_digest(main.model)
        full = self.whole.keep(step, self.before, after, None)
        self.micro.keep(step, self.before, after, None, digest)
        if self.trajectory is not None:
            self.trajectory_steps.append((step, after["weights"]))
        self.before = None
        main.bit_identical &= equivalence.ranks_bit_identical(main.model)
        if step < self.companion_steps:
            self._compare_companions(step, main, digest)
        if full or step == self.cfg.steps - 1:
            self._share(step)

    def _compare_companions(self, step: int, main: Run, digest: str) -> None:
        self.compared_steps += 1
        mine = dict(main.model.named_parameters())
        for i, run in enumerate(self.runs):
            if i == self.main:
                continue
            same = equivalence.params_digest(run.model) == digest
            self.bit_identical_to_main[i] &= same
            if not same:
                diff = max(float((p.detach() - mine[n].detach()).abs().max()) for n, p in run.model.named_parameters())
                self.max_diff[i] = max(self.max_diff[i], diff)
                run.bit_identical &= equivalence.ranks_bit_identical(run.model)
            else:  # the main variant's bits: its ranks agree exactly when the main one's do
                run.bit_identical &= main.bit_identical

    def _share(self, last: int) -> None:
        first = self.whole.first
        self.whole.share(last, self.whole_run)
        self.micro.share(last, self.micro_run)
        run = self.runs[self.main]
        run.micro_bit_identical = not self.micro_run.bits_differ
        if not self.full:
            return
        found = torch.zeros(last + 1 - first, dtype=torch.float64)
        probe = self.whole.twin.probe
        for step, after in self.trajectory_steps:  # rank 0's: one process's own run
            model, optimizer = self.trajectory
            train_step(model, optimizer, step, self.cfg)
            found[step - first] = float((probe.logits(model) - probe.logits(after)).abs().max())
        self.trajectory_steps.clear()
        found = found.to(self.ctx.device)
        dist.broadcast(found, src=0)
        for value in found.cpu().tolist():
            run.trajectory_drift.add(value)


LAB = entry.Lab(
    PROG,
    parse_args,
    check_args,
    lambda cfg, args, ctx: train(cfg, args, ctx),
    "minigpt.pages.lab01_check:render_check",
    ("world_size",),
    "lab/results/01-check-adamw-cpu.json",
)


def main(argv: list[str] | None = None) -> int:
    return entry.main(LAB, argv)


def fp64_and_first_step(cfg: TrainConfig, args: argparse.Namespace, ctx: launch.DistContext, variant: str) -> dict:
    """The harness's rulers 1 and 2 for the main variant: 20 float64 steps against a float64 twin,
    and one float32 forward and backward against one process."""
    check = proof.Proof(proof.DATA_PARALLEL, twin_norm="own")

    def build(c: TrainConfig) -> DDPSystem:
        return DDPSystem(variant, c, args, ctx)

    check.first_step(build, cfg, ctx)
    check.float64(build, replace(cfg, dtype="float32"), ctx, args.fp64_steps)
    return check.report


def train(cfg: TrainConfig, args: argparse.Namespace, ctx: launch.DistContext) -> dict:
    from tqdm import tqdm

    t_start = time.perf_counter()
    main_variant = "ring" if args.collective == "ring" else "bucketed"
    if args.check:
        variants = list(VARIANTS) if args.full else [main_variant, "torch-ddp"]
    else:
        variants = [main_variant]
    runs = [Run(v, cfg, args, ctx) for v in variants]
    launch.ready(ctx)  # every rank has built its models and optimizers: from here on, the collective timeout
    main_run = runs[variants.index(main_variant)]
    if ctx.is_main:
        layout = main_run.wrapped.bucket_layout()
        launch.log(
            ctx,
            f"MiniGPT {main_run.model.num_params():,} parameters | world size {ctx.world_size} "
            f"({ctx.backend}, {ctx.device}) | global batch {cfg.batch_size} = {ctx.world_size} x "
            f"{cfg.batch_size // ctx.world_size} | {cfg.optimizer} {cfg.dtype} | {cfg.steps} steps | "
            f"implementation: {impl.current()}",
        )
        launch.log(
            ctx,
            f"{len(layout)} buckets, each closed when it reaches {args.bucket_cap_mb:g} MiB: "
            + ", ".join(f"{b['bytes'] / 2**10:.0f} KiB" for b in layout),
        )
        if args.check:
            launch.log(ctx, f"--check: variants {', '.join(variants)}; one-process work shared over the ranks")
    rulers = fp64_and_first_step(cfg, args, ctx, main_variant) if args.check else {}
    companion_steps = cfg.steps if args.full else min(args.ddp_steps, cfg.steps)
    check = Check(runs, variants.index(main_variant), cfg, ctx, args.full, companion_steps) if args.check else None
    watch = Watch(main_run.model, cfg, main_run.optimizer)  # nan or inf: the step, the value, the setting

    bar = tqdm(
        range(cfg.steps),
        desc=f"[rank 0] train ({main_variant})",
        disable=args.quiet or not ctx.is_main,
        dynamic_ncols=True,
        file=sys.stdout,
    )
    losses, traced = [], None
    trace = profiler.StepTrace(args.trace, "lab01", ctx.rank, ctx.device, cfg.steps)
    for step in bar:
        if check:
            check.before_step(step)
        for run in check.companions(step) if check else runs:
            t0 = time.perf_counter()
            with trace.step(step, run.variant):
                loss = train_step(run.wrapped, run.optimizer, step, cfg, ctx.rank, ctx.world_size)
            run.seconds += time.perf_counter() - t0
            if run is main_run:
                total = torch.tensor([loss], dtype=torch.float64, device=ctx.device)
                dist.all_reduce(total)
                losses.append(float(total) / ctx.world_size)
                watch.after_step(step, losses[-1])
        written = trace.done_with(step)
        if written is not None and ctx.is_main:  # the report is rank 0's: its trace is read
            traced = profiler.summarize(written, [main_variant])[main_variant]
            launch.log(ctx, f"trace: {profiler.describe(traced)}")
        if check:
            check.after_step(step)
        if ctx.is_main:
            postfix = {"loss": f"{losses[-1]:.4f}"}
            if check and main_run.step_drift.values:
                postfix["step drift"] = f"{main_run.step_drift.final:.1e}"
            bar.set_postfix(postfix)
    bar.close()

    # every rank holds the same model (bit-identical): the scorer's batches are dealt out over the ranks
    accuracy = entry.tutor_score(main_run.model, args, cfg.block_size, ctx)
    m = variants.index(main_variant)
    per_variant = {
        main_variant: {
            "step_drift": main_run.step_drift.summary(),
            "step_drift_float32_probe": main_run.float32_probe_drift.summary() if args.full else None,
            "micro_batch_drift": main_run.micro_drift.summary(),
            "bit_identical_to_micro_batches": main_run.micro_bit_identical,
            "trajectory_drift": main_run.trajectory_drift.summary() if args.full else None,
            "ranks_bit_identical": main_run.bit_identical,
            "seconds_per_step": main_run.seconds / cfg.steps,
        }
    }
    for i, r in enumerate(runs):
        if i != m:
            per_variant[r.variant] = {
                "steps_compared": check.compared_steps,
                "bit_identical_to_main": check.bit_identical_to_main[i],
                "max_step_difference_from_main": check.max_diff[i],
                "ranks_bit_identical": r.bit_identical,
                "seconds_per_step": r.seconds / max(1, check.compared_steps),
            }
    report = {
        "main_variant": main_variant,
        "max_logit_drift": main_run.step_drift.worst if check else None,
        "final_logit_drift": main_run.step_drift.final if check else None,
        "max_micro_batch_drift": main_run.micro_drift.worst if check else None,
        "bit_identical_to_micro_batches": main_run.micro_bit_identical if check else None,
        "ranks_bit_identical": all(r.bit_identical for r in runs) if check else None,
        "tolerance": proof.FP32_DRIFT_BOUND,
        "probe": "float64 forward of the float32 weights" if cfg.dtype == "float32" else "float64",
        "full": bool(args.full),
        **accuracy,
        "world_size": ctx.world_size,
        "steps": cfg.steps,
        "optimizer": cfg.optimizer,
        "dtype": cfg.dtype,
        "seed": cfg.seed,
        "batch_size": cfg.batch_size,
        "accum": cfg.accum,
        "bucket_cap_mb": args.bucket_cap_mb,
        "buckets": main_run.wrapped.bucket_layout(),
        "bytes_all_reduced_per_step": main_run.wrapped.bytes_all_reduced,
        "bytes_model": main_run.model.num_params() * (8 if cfg.dtype == "float64" else 4),
        "last_step_timeline": main_run.wrapped.last_timeline(),
        "synchronised_backward_passes": main_run.wrapped.steps_synchronised,  # --accum: one per step
        "variants_bit_identical_to_each_other": bool(check and all(check.bit_identical_to_main)),
        "final_loss": losses[-1],
        "implementation": impl.current(),
        "variants": per_variant,
        "trace": traced,
    }
    if check:
        report.update(rulers)
        torch_ddp = variants.index("torch-ddp")
        report.update(
            fp32_max_step_drift=main_run.step_drift.worst,
            fp32_worst_step=main_run.step_drift.worst_step,
            fp32_steps=cfg.steps,
            fp32_twin_clips_with="own",
            pytorch_impl="torch.nn.parallel.DistributedDataParallel",
            pytorch_steps=check.compared_steps,
            pytorch_max_diff=check.max_diff[torch_ddp],
            same_as_pytorch=check.bit_identical_to_main[torch_ddp],
        )
        report.update(verdict(report).keys())
    return entry.finish(report, args, ctx, summary_lines, t_start)


def verdict(report: dict) -> proof.Verdict:
    """Lab 01's rulers. Its headline is the float32 step drift at every step, the twin clipping with its
    own norm (it holds with >= 3.7x margin on every kernel set), and, against one process that
    accumulates the same micro-batches, the same bound (on two ranks with one micro-batch each even
    bit-identical)."""
    check = proof.Proof(proof.DATA_PARALLEL, twin_norm="own", report=report)
    v = check.judge()
    v.at_most("max_micro_batch_drift", report["max_micro_batch_drift"], proof.FP32_DRIFT_BOUND, "same micro-batches")
    if report["world_size"] == 2 and report["accum"] == 1:
        # one micro-batch per rank: the twin adds the two ranks' gradients, a + b = b + a bit for bit; with
        # --accum it adds its micro-batches one after another, ((a1 + a2) + b1) + b2, another rounding
        v.true("bit_identical_to_micro_batches", report["bit_identical_to_micro_batches"], "on 2 ranks: a + b = b + a")
    if report["world_size"] == 2:
        v.true(
            "same_as_pytorch",
            report["same_as_pytorch"],
            f"bit-identical weights to DistributedDataParallel, {report['pytorch_steps']} steps side by side",
        )
    else:  # PyTorch multiplies by 1/N, ours divides by N: the same only for a power of two, and its first
        # step sends everything in one bucket, which gloo cuts into other pieces
        v.at_most(
            "pytorch_max_diff", report["pytorch_max_diff"], bounds.PYTORCH_DDP_BOUND, "one step from the same state"
        )
    v.equal("bytes_all_reduced_per_step", report["bytes_all_reduced_per_step"], report["bytes_model"], "4 B x params")
    v.true("ranks_bit_identical", report["ranks_bit_identical"], "every rank's parameters after every step")
    return v


def summary_lines(report: dict) -> list[str]:
    """The lines rank 0 prints at the end: the main variant's drifts, the other variants against it,
    one line per ruler and the verdict (the page's console block quotes them)."""
    lines = []
    if report.get("rulers"):
        full = report["full"]
        main = report["main_variant"]
        lines.append(
            "variant     | step drift, whole batch: max (step), final | step drift, same micro-batches: "
            "max, bit-identical | "
            + ("trajectory drift: max, first step > 1e-5 | " if full else "")
            + "ranks bit-identical"
        )
        for name, v in report["variants"].items():
            if name == main:
                s, m, t = v["step_drift"], v["micro_batch_drift"], v["trajectory_drift"]
                lines.append(
                    f"{name:11} | {s['max']:.2e} ({s['worst_step']}), {s['final']:.2e} | "
                    f"{m['max']:.2e}, {v['bit_identical_to_micro_batches']} | "
                    + (f"{t['max']:.2e}, {t['first_step_above_tolerance']} | " if full else "")
                    + f"{v['ranks_bit_identical']}"
                )
            else:
                lines.append(
                    f"{name:11} | bit-identical to {main} after each of {v['steps_compared']} steps: "
                    f"{v['bit_identical_to_main']} "
                    f"(largest difference {v['max_step_difference_from_main']:.2e}) | {v['ranks_bit_identical']}"
                )
        headline = (
            f"max logit drift {report['max_logit_drift']:.2e} (tolerance {report['tolerance']:g}) | ranks "
            f"bit-identical after every step: {report['ranks_bit_identical']}"
        )
        lines += proof.Verdict.of(report).lines(headline)
    lines.append(
        f"final: step {report['steps']} | loss {report['final_loss']:.4f} | tutor accuracy "
        f"{100 * report['tutor_accuracy']:.1f}% ({report['tutor_correct']}/{report['tutor_total']} "
        f"held-out test sentences) | {report['seconds']:.1f} s on {report['world_size']} ranks"
    )
    return lines
