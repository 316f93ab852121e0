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
import os
import sys
import time
from dataclasses import fields, replace

import torch
import torch.distributed as dist

from minigpt import cli, grammar, impl
from minigpt.divergence import Watch
from minigpt.parallel import equivalence, launch
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
# what picks the CPU kernels, so the float32 rounding (recorded in the report; see minigpt.runners.lab01_kernel_sets)
KERNEL_SET_VARIABLES = ("ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS", "ONEDNN_MAX_CPU_ISA")
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
    p.add_argument(
        "--check",
        action="store_true",
        help="also train the ring and PyTorch-DDP variants and compare all three with one process after every step",
    )
    p.add_argument("--report", metavar="FILE", help="write the results as JSON (rank 0; default: not written)")
    p.add_argument(
        "--timeout",
        type=cli.SECONDS,
        default=launch.DEFAULT_TIMEOUT_S,
        help="seconds any collective may wait for a peer before this rank gives up",
    )
    p.add_argument(
        "--impl",
        choices=impl.IMPLS,
        default=None,
        help="whose BucketedDDP and ring: the reference or yours in lab/exercises/ "
        "(default: $MINIGPT_IMPL or reference)",
    )
    p.add_argument(
        "--test-sentences",
        type=cli.POSITIVE_INT,
        default=None,
        help="score the tutor on the first N held-out test sentences (default: all 1209)",
    )
    p.add_argument("--quiet", action="store_true", help="no progress bar")
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
    if args.report:  # rank 0 writes it; every rank checks it, so that every rank refuses
        cli.output_file(args.report, "--report")
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
        self.step_drift = equivalence.DriftLog()  # against one process, whole batch
        self.float32_probe_drift = equivalence.DriftLog()  # the same, the probe's forward in float32
        self.micro_drift = equivalence.DriftLog()  # against one process, the same micro-batches
        self.micro_bit_identical = True  # ... and bit-identical to it after every step
        self.trajectory_drift = equivalence.DriftLog()
        self.bit_identical = True
        self.seconds = 0.0


class Check:
    """``--check``: after every step, every variant against one process, shared out over the ranks.

    Per step there are single-process *jobs*: for each variant, the step on the whole batch
    ("whole") and the step accumulating the ranks' micro-batches ("micro"), both from the
    variant's state before the step; and one step of the independent trajectory. Job k is done by
    rank k % world_size; its owner snapshots the variant's state before the step. A variant whose
    parameters have been bit-identical to an earlier variant's since step 0 takes the same
    single-process steps, so they are computed once (on two ranks the three variants stay
    identical: ``a + b`` is ``a + b`` however it is reduced; from three ranks on, the ring adds in
    another order than gloo, and each variant gets its own).
    """

    ROWS = ("whole", "micro", "micro differs", "trajectory", "whole, float32 probe")  # what each step measures

    def __init__(self, runs: list[Run], cfg: TrainConfig, ctx: launch.DistContext):
        self.runs, self.cfg, self.ctx = runs, cfg, ctx
        self.jobs = [("trajectory", 0)] + [(kind, i) for i in range(len(runs)) for kind in ("whole", "micro")]
        self.mine = {job for k, job in enumerate(self.jobs) if k % ctx.world_size == ctx.rank}
        self.configs = {"whole": cfg, "micro": replace(cfg, accum=cfg.accum * ctx.world_size)}
        self.probe = equivalence.Probe(build_model(cfg), block_size=cfg.block_size)
        self.scratch = {kind: self._model_and_optimizer(c) for kind, c in self.configs.items()}
        self.trajectory = self._model_and_optimizer(cfg) if ("trajectory", 0) in self.mine else None
        self.twin_of = {i: 0 for i in range(1, len(runs))}
        self.before: dict[int, tuple[dict, dict]] = {}

    def _model_and_optimizer(self, cfg: TrainConfig):
        model = build_model(cfg).to(self.ctx.device)
        return model, build_optimizer(model, cfg)

    def snapshot(self, i: int) -> None:
        """Before variant ``i`` steps: keep its state if this rank does one of its jobs."""
        if ("whole", i) in self.mine or ("micro", i) in self.mine:
            self.before[i] = equivalence.snapshot(self.runs[i].model, self.runs[i].optimizer)

    def after_step(self, step: int) -> None:
        """Do this rank's jobs for ``step``, share the results (one all-reduce), record them."""
        runs, n = self.runs, len(self.runs)
        digests = [equivalence.params_digest(run.model) for run in runs]
        self.twin_of = {i: t for i, t in self.twin_of.items() if digests[i] == digests[t]}
        # what this rank found, one row per measurement, one column per variant; shared with a MAX
        found = torch.zeros(len(self.ROWS), n, dtype=torch.float64)
        row = {name: k for k, name in enumerate(self.ROWS)}
        exact: dict[str, torch.Tensor] = {}  # each run's exact probe logits, by parameter digest

        def run_logits(j: int) -> torch.Tensor:
            """Run ``j``'s logits on the probe, computed once per distinct set of weights (on two ranks
            the three variants are twins: one float64 forward serves all three)."""
            if digests[j] not in exact:
                exact[digests[j]] = self.probe.logits(runs[j].model)
            return exact[digests[j]]

        for kind, i in sorted(self.mine):
            if kind == "trajectory":
                model, optimizer = self.trajectory
                train_step(model, optimizer, step, self.cfg)
                reference = self.probe.logits(model)
                for j in range(n):
                    found[row["trajectory"], j] = float((reference - run_logits(j)).abs().max())
            elif i not in self.twin_of:
                model, optimizer = self.scratch[kind]
                model.load_state_dict(self.before[i][0])
                optimizer.load_state_dict(copy.deepcopy(self.before[i][1]))
                train_step(model, optimizer, step, self.configs[kind])
                found[row[kind], i] = float((self.probe.logits(model) - run_logits(i)).abs().max())
                if kind == "whole":
                    found[row["whole, float32 probe"], i] = equivalence.logit_drift(
                        model, runs[i].model, self.probe.tokens
                    )
                else:
                    found[row["micro differs"], i] = float(equivalence.params_digest(model) != digests[i])
        self.before.clear()
        found = found.to(self.ctx.device)
        dist.all_reduce(found, op=dist.ReduceOp.MAX)
        found = found.cpu()
        for i, t in self.twin_of.items():  # a twin's single-process steps are its twin's
            trajectory = found[row["trajectory"], i].clone()
            found[:, i] = found[:, t]
            found[row["trajectory"], i] = trajectory
        for i, run in enumerate(runs):
            run.step_drift.add(float(found[row["whole"], i]))
            run.float32_probe_drift.add(float(found[row["whole, float32 probe"], i]))
            run.micro_drift.add(float(found[row["micro"], i]))
            run.micro_bit_identical &= not bool(found[row["micro differs"], i])
            run.trajectory_drift.add(float(found[row["trajectory"], i]))
            run.bit_identical &= equivalence.ranks_bit_identical(run.model)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        rank, _, world_size = launch.torchrun_env()
        cfg = check_args(args, world_size)
    except (ValueError, RuntimeError) as exc:
        return cli.refuse(PROG, str(exc))
    if args.impl:
        os.environ[impl.ENV_VAR] = args.impl
    ctx = launch.init(args.timeout)
    result = launch.run(ctx, PROG, lambda: train(cfg, args, ctx))
    launch.teardown()
    return 0 if result["passed"] else 1


def train(cfg: TrainConfig, args: argparse.Namespace, ctx: launch.DistContext) -> dict:
    from tqdm import tqdm

    t_start = time.perf_counter()
    main_variant = "ring" if args.collective == "ring" else "bucketed"
    variants = list(VARIANTS) if args.check else [main_variant]
    runs = [Run(v, cfg, args, ctx) for v in variants]
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
    check = Check(runs, cfg, ctx) if args.check else None
    watch = Watch(main_run.model, cfg, main_run.optimizer)  # nan or inf: the step, the value, the setting

    bar = tqdm(
        range(cfg.steps),
        desc=f"[rank 0] train ({main_variant})",
        disable=args.quiet or not ctx.is_main,
        dynamic_ncols=True,
        file=sys.stdout,
    )
    losses = []
    for step in bar:
        for i, run in enumerate(runs):
            if check:
                check.snapshot(i)
            t0 = time.perf_counter()
            loss = train_step(run.wrapped, run.optimizer, step, cfg, ctx.rank, ctx.world_size)
            run.seconds += time.perf_counter() - t0
            if run is main_run:
                total = torch.tensor([loss], dtype=torch.float64, device=ctx.device)
                dist.all_reduce(total)
                losses.append(float(total) / ctx.world_size)
                watch.after_step(step, losses[-1])
        if check:
            check.after_step(step)
        if ctx.is_main:
            postfix = {"loss": f"{losses[-1]:.4f}"}
            if check:
                postfix["step drift"] = f"{max(r.step_drift.final for r in runs):.1e}"
            bar.set_postfix(postfix)
    bar.close()

    # every rank scores the same model (bit-identical), so no rank waits for another
    accuracy = grammar.score(main_run.model, "test", max_sentences=args.test_sentences, block_size=cfg.block_size)
    seconds = time.perf_counter() - t_start
    per_variant = {
        r.variant: {
            "step_drift": r.step_drift.summary(),
            "step_drift_float32_probe": r.float32_probe_drift.summary(),
            "micro_batch_drift": r.micro_drift.summary(),
            "bit_identical_to_micro_batches": r.micro_bit_identical,
            "trajectory_drift": r.trajectory_drift.summary(),
            "ranks_bit_identical": r.bit_identical,
            "seconds_per_step": r.seconds / cfg.steps,
        }
        for r in runs
    }
    passed = True
    if check:
        worst = max(max(r.step_drift.worst, r.micro_drift.worst) for r in runs)
        identical = all(r.bit_identical for r in runs)
        passed = worst <= equivalence.TOLERANCE and identical
    report = {
        "max_logit_drift": max(r.step_drift.worst for r in runs) if check else None,
        "final_logit_drift": max(r.step_drift.final for r in runs) if check else None,
        "max_micro_batch_drift": max(r.micro_drift.worst for r in runs) if check else None,
        "bit_identical_to_micro_batches": all(r.micro_bit_identical for r in runs) if check else None,
        "ranks_bit_identical": all(r.bit_identical for r in runs) if check else None,
        "tolerance": equivalence.TOLERANCE,
        "probe": "float64 forward of the float32 weights" if cfg.dtype == "float32" else "float64",
        "passed": passed,
        "tutor_accuracy": accuracy["accuracy"],
        "tutor_correct": accuracy["correct"],
        "tutor_total": accuracy["total"],
        "world_size": ctx.world_size,
        "steps": cfg.steps,
        "backend": ctx.backend,
        "device": str(ctx.device),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "torch": torch.__version__,
        "kernel_set_variables": {name: os.environ.get(name) for name in KERNEL_SET_VARIABLES},
        "date": time.strftime("%Y-%m-%d"),
        "optimizer": cfg.optimizer,
        "dtype": cfg.dtype,
        "seed": cfg.seed,
        "batch_size": cfg.batch_size,
        "accum": cfg.accum,
        "bucket_cap_mb": args.bucket_cap_mb,
        "buckets": main_run.wrapped.bucket_layout(),
        "bytes_all_reduced_per_step": main_run.wrapped.bytes_all_reduced,
        "last_step_timeline": main_run.wrapped.last_timeline(),
        "synchronised_backward_passes": main_run.wrapped.steps_synchronised,  # --accum: one per step
        "variants_bit_identical_to_each_other": bool(check and len(check.twin_of) == len(runs) - 1),
        "final_loss": losses[-1],
        "seconds": seconds,
        "implementation": impl.current(),
        "variants": per_variant,
    }
    if ctx.is_main:
        print_summary(report, ctx)
        if args.report:
            launch.write_report(args.report, report)
            launch.log(ctx, f"report written to {args.report}")
    return report


def print_summary(report: dict, ctx: launch.DistContext) -> None:
    if report["max_logit_drift"] is not None:
        launch.log(
            ctx,
            "variant     | step drift, whole batch: max (step), final | step drift, same micro-batches: "
            "max, bit-identical | trajectory drift: max, first step > 1e-5 | ranks bit-identical",
        )
        for name, v in report["variants"].items():
            s, m, t = v["step_drift"], v["micro_batch_drift"], v["trajectory_drift"]
            launch.log(
                ctx,
                f"{name:11} | {s['max']:.2e} ({s['worst_step']}), {s['final']:.2e} | "
                f"{m['max']:.2e}, {v['bit_identical_to_micro_batches']} | "
                f"{t['max']:.2e}, {t['first_step_above_tolerance']} | {v['ranks_bit_identical']}",
            )
        verdict = "PASS" if report["passed"] else "FAIL"
        launch.log(
            ctx,
            f"check {verdict}: max logit drift {report['max_logit_drift']:.2e} "
            f"(tolerance {report['tolerance']:g}) | ranks bit-identical after every step: "
            f"{report['ranks_bit_identical']}",
        )
    launch.log(
        ctx,
        f"final: step {report['steps']} | loss {report['final_loss']:.4f} | tutor accuracy "
        f"{100 * report['tutor_accuracy']:.1f}% ({report['tutor_correct']}/{report['tutor_total']} "
        f"held-out test sentences) | {report['seconds']:.1f} s on {report['world_size']} ranks",
    )


if __name__ == "__main__":
    sys.exit(main())
