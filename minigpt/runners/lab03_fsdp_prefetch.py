"""Lab 03: PyTorch's real FSDP on MiniGPT, with every prefetch setting, traced and checked.

    torchrun --nproc_per_node=2 lab/03_fsdp_prefetch.py --trace-dir out/lab03
    torchrun --nproc_per_node=2 lab/03_fsdp_prefetch.py --variants fsdp2-implicit,fsdp1-backward-post --steps 5
    python lab/03_fsdp_prefetch.py --render lab/results/03-prefetch-cpu.json

The page: lab/03-fsdp-prefetch.md. FSDP cuts the model into *units*: here each transformer block is
one unit and the root (the embeddings, the final norm and the tied output layer) is another. Between
uses, every rank keeps only its shard (1/N) of a unit's parameters. Before a unit computes, an
**all-gather** makes its parameters whole on every rank; after it, they are freed again (resharded);
after its backward, a **reduce-scatter** leaves each rank the averaged gradient of its own shard.
**Prefetching** issues a unit's all-gather *before* the unit needs it - while an earlier unit
computes - so that the communication hides behind computation instead of stopping it.

The variants (:data:`~minigpt.fsdp.variants.VARIANTS`), each trained ``--steps`` steps (the first
steps of :class:`~minigpt.train.TrainConfig`'s AdamW schedule) from the same seed, step by step in turn:

* FSDP2 (``fully_shard`` per block, then the root): ``fsdp2-implicit`` (the defaults: in backward,
  each unit's pre-backward prefetches the unit before it); ``fsdp2-explicit-forward`` (each unit
  prefetches the next in forward, ``set_modules_to_forward_prefetch``); ``fsdp2-explicit-backward``
  (the *two* units before it in backward, ``set_modules_to_backward_prefetch``); ``fsdp2-no-reshard``
  (``reshard_after_forward=False``: blocks stay whole from forward to backward, which gathers
  nothing); ``fsdp2-async-unshard`` (the defaults, asynchronous unshards); ``fsdp2-async-explicit``
  (asynchronous unshards, both explicit prefetches).
* FSDP1 (``FullyShardedDataParallel``, ``ModuleWrapPolicy({Block})``, ``device_id=torch.device("cpu")``
  to run on a CPU at all): ``fsdp1-no-prefetch`` (``backward_prefetch=None``), ``fsdp1-backward-pre``
  (``BACKWARD_PRE``, its default), ``fsdp1-backward-post`` (``BACKWARD_POST``: prefetch after a
  block's backward, not before), ``fsdp1-forward-prefetch`` (``forward_prefetch=True``, from the
  second step on: it follows the order recorded in the first).

On a CPU with gloo a blocking all-gather blocks: prefetching changes *when* it is issued, but only
the asynchronous unshard lets gloo's own thread gather while the training thread computes (on a
GPU, FSDP's separate CUDA streams do that for every variant).

For every variant the lab records (:mod:`minigpt.fsdp.trace`) the order of events, a timeline
figure, the all-gathers, reduce-scatters and all-reduces per step, the bytes each rank sends, the
step time and the exposed communication time. It checks every step against one process (the
harness's :class:`~minigpt.parallel.proof.Twin`: |logit difference| <= 1e-5 on the probe), and the
order of the collectives against :func:`~minigpt.fsdp.variants.predict_event_order`, from FSDP's rules.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from minigpt import cli, grammar, profiler
from minigpt.divergence import Watch
from minigpt.fsdp.trace import FSDPTracer, event_log
from minigpt.fsdp.variants import VARIANTS, clip_gradients, predict_event_order, sharded_optimizer, wrap
from minigpt.parallel import bounds, launch, proof
from minigpt.runners import entry
from minigpt.train import TrainConfig, build_model, lr_at, validate

PROG = "lab/03_fsdp_prefetch.py"
DEFAULT_STEPS = 20


def full_state(wrapped: nn.Module, optimizer: torch.optim.Optimizer) -> tuple[dict, dict]:
    """The whole model and optimizer state, gathered on every rank (a collective call)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    with warnings.catch_warnings():  # FSDP1 on one rank (NO_SHARD) says at every call that it returns it whole
        warnings.filterwarnings("ignore", message=".*NO_SHARD.*full_state_dict will be returned")
        model_state, optim_state = get_state_dict(wrapped, optimizer, options=StateDictOptions(full_state_dict=True))
    return (
        {k: v.detach().cpu().clone() for k, v in model_state.items()},
        {
            name: {k: v.cpu().clone() if torch.is_tensor(v) else v for k, v in s.items()}
            for name, s in optim_state["state"].items()
        },
    )


def as_state(state: tuple[dict, dict]) -> proof.State:
    """A :func:`full_state` as the harness's :data:`~minigpt.parallel.proof.State`, for its twin."""
    weights, per_param = state
    moments: dict[str, dict] = {}
    steps = set()
    for name, saved in per_param.items():
        for key, value in saved.items():
            if key == "step":
                steps.add(float(value))
                step = value
            else:
                moments.setdefault(key, {})[name] = value
    if len(steps) > 1:
        raise RuntimeError(f"the parameters' optimizer steps differ: {sorted(steps)}")
    return {"weights": weights, "moments": moments, "step": step if steps else None}


# ----------------------------------------------------------------------------------------------
# The variants take turns: step k of every variant, then step k + 1 of every variant, so a slow
# moment of a shared machine slows all of them alike


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class VariantRun:
    """One variant: its wrapped model, optimizer and tracer, and what it measured on this rank."""

    def __init__(self, name: str, cfg: TrainConfig, ctx: launch.DistContext):
        self.name, self.variant, self.cfg, self.ctx = name, VARIANTS[name], cfg, ctx
        wrapped, blocks = wrap(self.variant, build_model(cfg).to(ctx.device), ctx.device)
        self.wrapped, self.optimizer = wrapped, sharded_optimizer(wrapped, cfg)
        self.tracer = FSDPTracer(wrapped, self.variant.api, blocks)
        self.watch = Watch(wrapped, cfg)  # nan or inf: the step, the value, the setting to look at
        self.step_times: list[float] = []
        self.losses: list[float] = []
        # the full state before and after the last step (before step 0: the seed's weights, no optimizer state)
        self.before: tuple[dict, dict] | None = None
        self.after = ({k: v.detach().cpu().clone() for k, v in build_model(cfg).state_dict().items()}, {})

    def train_step(self, step: int, bar=None) -> None:
        """One traced, timed step on this rank's slice of the global batch; then gather the state.
        ``bar``: the profiler's labelled bar of the step (forward, backward, optimizer), when traced."""
        cfg, ctx = self.cfg, self.ctx
        x, y, mask = (
            t.to(ctx.device)
            for t in grammar.get_batch(
                "train", step, cfg.batch_size, ctx.rank, ctx.world_size, seed=cfg.seed, block_size=cfg.block_size
            )
        )
        self.wrapped.train()
        dist.barrier()  # the ranks start the step together
        synchronize(ctx.device)
        t0 = time.perf_counter()
        with bar or contextlib.nullcontext():
            with self.tracer, self.tracer.step(step):  # forward and backward: where FSDP communicates
                _, loss = self.wrapped(x, y, mask)
                self.tracer.enter_backward()
                loss.backward()
            clip_gradients(self.variant, self.wrapped, cfg.grad_clip)
            for group in self.optimizer.param_groups:
                group["lr"] = lr_at(step, cfg.lr, cfg.min_lr, cfg.warmup, cfg.steps)
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
            synchronize(ctx.device)
        self.step_times.append(time.perf_counter() - t0)
        self.losses.append(loss.item())
        self.before, self.after = self.after, full_state(self.wrapped, self.optimizer)
        # the weights gathered in full are the same on every rank: every rank stops at the same step
        self.watch.after_step(step, self.losses[-1], self.after[0].items())

    def measurements(self) -> dict:
        """What rank 0 needs from this rank to write the report."""
        last = self.tracer.steps[-1]
        return {
            "step_times": self.step_times,
            "losses": self.losses,
            "summaries": [record.summary() for record in self.tracer.steps],
            "last_events": last.events,
            "last_schedule": last.schedule(),
            "log": event_log(last, self.ctx.rank),
        }


def summarize(name: str, drifts: list[float], ranks: list[dict], world_size: int, n_layer: int) -> dict:
    """One variant's entry in the report, from every rank's :meth:`VariantRun.measurements`."""
    variant, steps = VARIANTS[name], len(drifts)
    later = range(1, steps) if steps > 1 else range(steps)  # the first step records FSDP's order
    step_times = [max(r["step_times"][s] for r in ranks) for s in later]  # the slowest rank sets the pace
    exposed = [statistics.mean(r["summaries"][s]["exposed_s"] for r in ranks) for s in later]
    last = [r["summaries"][-1] for r in ranks]
    predicted = predict_event_order(n_layer, name) if world_size > 1 else None
    return {
        "api": variant.api,
        "description": {"en": variant.en, "es": variant.es},
        "step_drift": drifts,
        "max_step_drift": max(drifts),
        "passed": max(drifts) <= bounds.FP32_DRIFT_BOUND,
        "calls_per_step": last[0]["calls"],
        "calls_same_every_step_and_rank": all(
            r["summaries"][s]["calls"] == last[0]["calls"] for r in ranks for s in later
        ),
        "sent_bytes_per_step": [s["sent_bytes"] for s in last],  # per rank
        "input_bytes_per_step": [s["input_bytes"] for s in last],
        "output_bytes_per_step": [s["output_bytes"] for s in last],
        "median_step_s": statistics.median(step_times),
        "median_exposed_s": statistics.median(exposed),
        "step_s": [r["step_times"] for r in ranks],
        "exposed_s": [[s["exposed_s"] for s in r["summaries"]] for r in ranks],
        "final_loss": statistics.mean(r["losses"][-1] for r in ranks),
        "all_gather_order": [s["all_gather_order"] for s in last],
        "all_gather_phases": [
            [e["phase"] for e in r["last_events"] if e["what"] == "all-gather issued"] for r in ranks
        ],
        "schedule": [r["last_schedule"] for r in ranks],
        "predicted_schedule": predicted,
        "prediction_matches": None if predicted is None else all(r["last_schedule"] == predicted for r in ranks),
        "last_step_events": [r["last_events"] for r in ranks],
    }


# ----------------------------------------------------------------------------------------------
# The command line


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = cli.torchrun_parser(PROG, __doc__)
    p.add_argument("--variants", default="all", help=f"comma-separated, or all: {', '.join(VARIANTS)}")
    p.add_argument(
        "--steps",
        type=cli.POSITIVE_INT,
        default=DEFAULT_STEPS,
        help="training steps per variant (the first of TrainConfig's schedule)",
    )
    p.add_argument("--seed", type=cli.SEED, default=0, help="the weights and batches of every variant")
    p.add_argument("--trace-dir", metavar="DIR", help="write per variant its event log and timeline figures (rank 0)")
    entry.add_run_flags(p, learner_code=False, trace="lab03")
    cli.add_device_flag(p)
    return p.parse_args(argv)


def check_args(args: argparse.Namespace, world_size: int) -> tuple[list[str], TrainConfig]:
    """The variants and the config, or ValueError naming the first value that cannot work
    (before any process group exists, so every rank stops at once with the same message)."""
    names = list(VARIANTS) if args.variants == "all" else [v.strip() for v in args.variants.split(",")]
    for name in names:
        if name not in VARIANTS:
            raise cli.BadInput(
                f"--variants {args.variants}: unknown variant {name!r}; choose from all, {', '.join(VARIANTS)}"
            )
    if len(set(names)) != len(names):
        raise cli.BadInput(f"--variants {args.variants}: names a variant twice; give each once")
    cfg = TrainConfig(seed=args.seed)
    validate(cfg)
    if args.steps > cfg.steps:
        raise cli.BadInput(f"--steps {args.steps}: too large; give 1..{cfg.steps} (TrainConfig's schedule)")
    cli.divisible_by_world(None, cfg.batch_size, world_size)
    if args.trace_dir:  # rank 0 writes there; every rank checks it, so that every rank refuses
        cli.output_dir(args.trace_dir, "--trace-dir")
    return names, cfg


LAB = entry.Lab(
    PROG,
    parse_args,
    check_args,
    lambda settings, args, ctx: run(*settings, args, ctx),
    "minigpt.pages.lab03_prefetch:render",
    ("variants", "n_layer"),
    "lab/results/03-prefetch-cpu.json",
    verdict_key="passed",
)


def main(argv: list[str] | None = None) -> int:
    return entry.main(LAB, argv)


def run(names: list[str], cfg: TrainConfig, args: argparse.Namespace, ctx: launch.DistContext) -> dict:
    from tqdm import tqdm

    if not args.quiet:
        launch.log(
            ctx,
            f"MiniGPT {build_model(cfg).num_params():,} parameters, {cfg.n_layer} blocks | world size "
            f"{ctx.world_size} ({ctx.backend}, {ctx.device}) | global batch {cfg.batch_size} = "
            f"{ctx.world_size} x {cfg.batch_size // ctx.world_size} | {args.steps} steps of "
            f"{len(names)} variant(s), taking turns",
        )
    runs = [VariantRun(name, cfg, ctx) for name in names]
    twin = proof.Twin(cfg, ctx.device)  # one process, the whole global batch, from a run's state
    drifts = torch.zeros(len(runs), args.steps, dtype=torch.float64)
    bar = tqdm(
        range(args.steps),
        desc="[rank 0] steps",
        disable=args.quiet or not ctx.is_main,
        dynamic_ncols=True,
        file=sys.stdout,
    )
    # one traced step per variant: ten variants' three steps make a trace of 100 MB before gzip
    trace = profiler.StepTrace(args.trace, "lab03", ctx.rank, ctx.device, args.steps, steps=1)
    traced = None
    for step in bar:
        for variant_run in runs:
            variant_run.train_step(step, trace.step(step, variant_run.name))
        written = trace.done_with(step)
        if written is not None and ctx.is_main:  # the report is rank 0's: its trace is read
            traced = profiler.summarize(written, names)
            for summary in traced.values():
                launch.log(ctx, f"trace: {profiler.describe(summary)}")
        for i, variant_run in enumerate(runs):  # the one-process steps, shared out: the ranks work at once
            if (i + step) % ctx.world_size == ctx.rank:
                drifts[i, step] = twin.drift(step, as_state(variant_run.before), variant_run.after[0])
    bar.close()
    drifts = drifts.to(ctx.device)
    dist.all_reduce(drifts, op=dist.ReduceOp.MAX)
    gathered: list = [None] * ctx.world_size
    dist.all_gather_object(gathered, [variant_run.measurements() for variant_run in runs])
    results, logs = {}, {}
    for i, name in enumerate(names):
        if ctx.is_main:
            results[name] = summarize(name, drifts[i].tolist(), [g[i] for g in gathered], ctx.world_size, cfg.n_layer)
            logs[name] = "\n".join(g[i]["log"] for g in gathered)
        else:  # every rank knows the verdict, only rank 0 the details
            results[name] = {
                "max_step_drift": float(drifts[i].max()),
                "passed": float(drifts[i].max()) <= bounds.FP32_DRIFT_BOUND,
            }
    passed = all(r["passed"] for r in results.values())
    report = {
        "world_size": ctx.world_size,
        "backend": ctx.backend,
        "device": str(ctx.device),
        "machine": f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} thread(s) per process",
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "date": time.strftime("%Y-%m-%d"),
        "clock": "host" if ctx.device.type == "cuda" else "cpu",
        "steps": args.steps,
        "seed": cfg.seed,
        "batch_size": cfg.batch_size,
        "n_layer": cfg.n_layer,
        "parameters": build_model(cfg).num_params(),
        "tolerance": bounds.FP32_DRIFT_BOUND,
        "passed": passed,
        "variants": results,
        "trace": traced,
    }
    if ctx.is_main:
        from minigpt.pages.lab03_prefetch import draw_timeline, table

        print(table(report, "en"), end="")
        verdict = "PASS" if passed else "FAIL"
        launch.log(
            ctx,
            f"check {verdict}: max step drift {max(r['max_step_drift'] for r in results.values()):.2e} "
            f"(tolerance {bounds.FP32_DRIFT_BOUND:g})",
        )
        if ctx.world_size < 2:
            launch.log(
                ctx,
                "one rank: FSDP2 gathers and scatters nothing, FSDP1 switches to NO_SHARD (one "
                "all-reduce per unit, over one rank); the predicted orders (for 2 or more ranks) "
                "are not compared",
            )
        if ctx.device.type == "cuda":
            launch.log(
                ctx,
                "on a GPU the times in the logs and figures are when the host issued or learned of "
                "the work; use the PyTorch profiler for device times",
            )
        if args.trace_dir:
            folder = Path(args.trace_dir)
            folder.mkdir(parents=True, exist_ok=True)
            for name, r in results.items():
                (folder / f"{name}-events.txt").write_text(logs[name])
                for lang in ("en", "es"):
                    draw_timeline(name, r, report, lang, folder / f"{name}-timeline-{lang}.png")
            launch.log(ctx, f"event logs and timelines written to {folder}")
        if args.report:
            launch.write_report(args.report, report, indent=1)
            launch.log(ctx, f"report written to {args.report}")
    return report
