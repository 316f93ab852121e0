"""Lab 06: MiniGPT cut into pipeline stages, one rank a stage, scheduled by hand.

    torchrun --nproc_per_node=2 lab/06_pipeline.py                                        # train (1F1B), tutor accuracy
    torchrun --nproc_per_node=2 lab/06_pipeline.py --check --report out/lab06-pipeline.json  # ... and the proofs
    torchrun --nproc_per_node=4 lab/06_pipeline.py --check --schedule gpipe              # 4 stages, GPipe
    torchrun --nproc_per_node=2 lab/06_pipeline.py --check --impl exercises              # with your exercises

Every rank builds the same MiniGPT from ``--seed`` and keeps its stage
(:class:`~minigpt.parallel.pipeline.PipelineStage`); each step's batch is cut into
``--micro-batches`` micro-batches that go through the stages in the order ``--schedule`` lists
(the chart is printed first). ``--check`` adds:

* **one step, one process** - for GPipe and for 1F1B, the gradients of every stage (the tied matrix
  after its swap) against one process's on the whole batch (float32 within 1e-5; float64 too);
* **PyTorch's own pipeline** - the same step through ``torch.distributed.pipelining``
  (``ScheduleGPipe``, ``Schedule1F1B``) around the same stages: the gradients must agree within
  1e-5 (with m a power of two they come out bit-identical: the same operations in the same order);
* **bytes** - what each stage passes to ``isend`` in that step against
  :func:`~minigpt.parallel.pipeline.step_bytes_model`;
* **activations held** - the most micro-batches each stage holds at once: GPipe m, 1F1B p - s;
* **bubble** - for several m, the idle share of a step measured on the wall clock (time blocked in
  receives, and the stages that finish early) against (p - 1) / (m + p - 1);
* **training** - before every step the whole state (weights and AdamW moments, gathered) is loaded
  into one process that takes the same step on the whole batch; the largest logit difference on
  the probe batch after the two steps is the step drift (Lab 01's criterion, 1e-5). The two copies
  of the tied matrix must stay bit-identical.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace

import torch
import torch.distributed as dist

from minigpt import cli, grammar, impl
from minigpt.divergence import Watch
from minigpt.parallel import launch, proof
from minigpt.parallel.pipeline import (
    SCHEDULES,
    Link,
    MicroBatches,
    PipelineStage,
    PipelineTimeout,
    StepRecord,
    backward_step,
    bubble_fraction,
    chart,
    check_posting_order,
    check_schedule,
    clip_grad_norm_,
    forward_only,
    forward_step,
    peak_held,
    run_schedule,
    schedule_orders,
    step_bytes_model,
    sync_tied_gradient,
)
from minigpt.parallel.ring import ByteCounter
from minigpt.runners import entry
from minigpt.train import TrainConfig, build_model, build_optimizer, lr_at
from minigpt.zero import analytic as za

PROG = "lab/06_pipeline.py"
EXERCISE_MODULE = "lab06_pipeline"
DEFAULT_CHECK_STEPS = 150  # --check: the first 150 of the run's steps (--full: all of them)
BUBBLE_REPEATS = 5


def pieces() -> tuple[dict, object, object]:
    """The schedules and the forward and backward step of ``MINIGPT_IMPL``: the reference's, or the
    learner's 1F1B (Exercise 6.1) and steps (Exercise 6.2). GPipe is never an exercise."""
    if impl.current() == "reference":
        return dict(SCHEDULES), forward_step, backward_step
    schedules = {"gpipe": SCHEDULES["gpipe"], "1f1b": impl.load(EXERCISE_MODULE, "one_f_one_b")}
    return schedules, impl.load(EXERCISE_MODULE, "forward_step"), impl.load(EXERCISE_MODULE, "backward_step")


class Pipeline:
    """This rank's stage (on the rank's device), its optimizer, its link to its neighbours, and the
    schedule it runs."""

    def __init__(self, cfg: TrainConfig, ctx: launch.DistContext, schedule: str, micro_batches: int):
        schedules, self.forward, self.backward = pieces()
        self.cfg, self.ctx, self.m = cfg, ctx, micro_batches
        self.stages = ctx.world_size
        whole = build_model(cfg).to(ctx.device)
        self.names = [name for name, _ in whole.named_parameters()]  # the tied matrix once, as wte.weight
        self.stage = PipelineStage(whole, ctx.rank, self.stages)
        self.optimizer = build_optimizer(self.stage, cfg)
        self.orders = schedule_orders(schedules[schedule], self.stages, micro_batches)
        self.played = check_schedule(self.orders, micro_batches)  # ValueError before anything is sent
        if ctx.backend == "nccl":  # NCCL ignores the tags: each wire must carry its messages in order
            check_posting_order(self.orders)
        self.counter, self.norm_counter = ByteCounter(), ByteCounter()
        shape = (cfg.batch_size // micro_batches, cfg.block_size, cfg.n_embd)
        dtype = torch.float64 if cfg.dtype == "float64" else torch.float32
        self.link = Link(ctx.rank, list(range(self.stages)), shape, dtype, ctx.timeout_s, self.counter, ctx.device)

    def batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The whole batch of ``step`` (every stage reads it: the first its tokens, the last its
        targets and masks), on this rank's device."""
        batch = grammar.get_batch(
            "train", step, self.cfg.batch_size, seed=self.cfg.seed, block_size=self.cfg.block_size
        )
        return tuple(t.to(self.ctx.device) for t in batch)

    def forward_backward(self, step: int) -> StepRecord:
        """The schedule on the batch of ``step``, then the tied matrix's gradient swapped."""
        batches = MicroBatches.cut(*self.batch(step), self.m)
        dist.barrier()  # every stage starts its clock together (for the bubble)
        record = run_schedule(self.stage, self.orders[self.ctx.rank], batches, self.link, self.forward, self.backward)
        sync_tied_gradient(self.stage, 0, self.stages - 1, self.counter)
        return record

    def train_step(self, step: int) -> tuple[float, torch.Tensor | None]:
        """:func:`minigpt.train.train_step` for a pipeline: the loss (every rank) and the norm."""
        record = self.forward_backward(step)
        norm = (
            clip_grad_norm_(self.stage, self.cfg.grad_clip, self.names, self.norm_counter)
            if self.cfg.grad_clip > 0
            else None
        )
        for group in self.optimizer.param_groups:
            group["lr"] = lr_at(step, self.cfg.lr, self.cfg.min_lr, self.cfg.warmup, self.cfg.steps)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        loss = torch.tensor([record.loss if self.stage.is_last else 0.0], dtype=torch.float64, device=self.ctx.device)
        dist.all_reduce(loss)
        return float(loss[0]), norm

    def whole_state(self) -> dict:
        """The whole model's weights and AdamW state, in MiniGPT's names, on every rank, on its device.
        The stages' parts travel as CPU copies: a pickled GPU tensor would come back on the GPU of the
        rank that sent it. (AdamW's step counter stays on the CPU, where AdamW keeps it.)"""
        named = self.stage.named_in_model()
        cpu = torch.device("cpu")
        mine = {"weights": {n: p.detach().to(cpu, copy=True) for n, p in named}, "moments": {}, "step": None}
        for key in ("exp_avg", "exp_avg_sq", "momentum_buffer"):
            found = {
                n: self.optimizer.state[p][key].to(cpu, copy=True)
                for n, p in named
                if key in self.optimizer.state.get(p, {})
            }
            if found:
                mine["moments"][key] = found
        first = self.optimizer.state.get(named[0][1], {})
        if "step" in first:
            mine["step"] = first["step"].to(cpu, copy=True)
        parts = [None] * self.stages
        dist.all_gather_object(parts, mine)
        device = self.ctx.device
        whole = {"weights": {}, "moments": {}, "step": parts[0]["step"]}
        for part in parts:
            whole["weights"].update({n: t.to(device) for n, t in part["weights"].items()})
            for key, values in part["moments"].items():
                whole["moments"].setdefault(key, {}).update({n: t.to(device) for n, t in values.items()})
        return whole

    def forward_logits(self, step: int) -> torch.Tensor | None:
        """The logits of ``step``'s whole batch through the stages (:func:`forward_only`): on the
        last stage, None on the others."""
        return forward_only(self.stage, MicroBatches.cut(*self.batch(step), self.m), self.link)

    # -- the proof harness's System ---------------------------------------------------------------

    def first_step(self) -> proof.FirstStep:
        logits = self.forward_logits(0)
        self.forward_backward(0)
        grads = {n: p.grad for n, p in self.stage.named_in_model() if p.grad is not None}
        return proof.FirstStep(slice(None), logits, grads)


def tied_copies_identical(pipe: Pipeline) -> bool:
    """The first and the last stage hold bit-identical copies of the tied matrix (every rank)."""
    weight = pipe.stage.tied_weight()
    digests = [None] * pipe.stages
    dist.all_gather_object(digests, None if weight is None else weight.detach().cpu().numpy().tobytes())
    copies = [d for d in digests if d is not None]
    return len(set(copies)) <= 1


# ----------------------------------------------------------------------------------------------
# The proofs


def one_step(cfg: TrainConfig, ctx: launch.DistContext, micro_batches: int) -> dict:
    """One forward and backward of both schedules against one process on the same batch: the largest
    gradient difference (every stage, max over ranks), the loss, the bytes, the activations held."""
    one = build_model(cfg).to(ctx.device)
    batch = grammar.get_batch("train", 0, cfg.batch_size, seed=cfg.seed, block_size=cfg.block_size)
    _, loss = one(*(t.to(ctx.device) for t in batch))
    loss.backward()
    grads = {n: p.grad for n, p in one.named_parameters()}
    grads["lm_head.weight"] = grads["wte.weight"]
    out = {}
    for schedule in SCHEDULES:
        pipe = Pipeline(cfg, ctx, schedule, micro_batches)
        record = pipe.forward_backward(0)
        diff = max(float((p.grad - grads[n]).abs().max()) for n, p in pipe.stage.named_in_model())
        found = torch.tensor(
            [diff, abs(record.loss - loss.item()) if pipe.stage.is_last else 0.0],
            dtype=torch.float64,
            device=ctx.device,
        )
        dist.all_reduce(found, op=dist.ReduceOp.MAX)
        per_rank = [None] * ctx.world_size
        dist.all_gather_object(per_rank, (pipe.counter.sent, record.peak_held))
        out[schedule] = {
            "max_grad_diff": float(found[0]),
            "loss_diff": float(found[1]),
            "bytes_sent": [b for b, _ in per_rank],
            "peak_activations": [h for _, h in per_rank],
            "peak_activations_expected": [peak_held(order) for order in pipe.orders],
        }
    return out


def torch_pipelining(cfg: TrainConfig, ctx: launch.DistContext, micro_batches: int) -> dict:
    """The same first step through PyTorch's own pipeline (``torch.distributed.pipelining``: its
    ``PipelineStage`` around the same stage module, ``ScheduleGPipe`` / ``Schedule1F1B``, MiniGPT's
    loss as ``loss_fn``, the gradients scaled by 1/m at the end), then the tied gradient swapped as
    ours is: the largest difference from our gradients, and whether they are bit-identical."""
    from torch.distributed.pipelining import PipelineStage as TorchStage, Schedule1F1B, ScheduleGPipe

    from minigpt.model import masked_loss

    batch = grammar.get_batch("train", 0, cfg.batch_size, seed=cfg.seed, block_size=cfg.block_size)
    x, y, mask = (t.to(ctx.device) for t in batch)
    target = torch.stack([y, mask.long()], dim=-1)  # one tensor, so that torch cuts both into micro-batches

    def loss_fn(logits: torch.Tensor, packed: torch.Tensor) -> torch.Tensor:
        return masked_loss(logits, packed[..., 0], packed[..., 1].bool())

    out = {}
    for name, schedule_class in (("gpipe", ScheduleGPipe), ("1f1b", Schedule1F1B)):
        ours = Pipeline(cfg, ctx, name, micro_batches)
        ours.forward_backward(0)
        theirs = PipelineStage(build_model(cfg).to(ctx.device), ctx.rank, ctx.world_size)
        rows = cfg.batch_size // micro_batches
        example = (
            torch.zeros(rows, cfg.block_size, dtype=torch.long, device=ctx.device)
            if ctx.rank == 0
            else (torch.zeros(rows, cfg.block_size, cfg.n_embd, device=ctx.device))
        )
        stage = TorchStage(theirs, ctx.rank, ctx.world_size, ctx.device, input_args=(example,))
        schedule = schedule_class(stage, micro_batches, loss_fn=loss_fn)
        if ctx.rank == 0:
            schedule.step(x)
        elif ctx.rank == ctx.world_size - 1:
            schedule.step(target=target)
        else:
            schedule.step()
        sync_tied_gradient(theirs, 0, ctx.world_size - 1, ByteCounter())
        pairs = list(zip(ours.stage.parameters(), theirs.parameters()))
        found = torch.tensor(
            [
                max(float((a.grad - b.grad).abs().max()) for a, b in pairs),
                float(not all(torch.equal(a.grad, b.grad) for a, b in pairs)),
            ],
            dtype=torch.float64,
            device=ctx.device,
        )
        dist.all_reduce(found, op=dist.ReduceOp.MAX)
        out[name] = {"max_grad_diff": float(found[0]), "bit_identical": not bool(found[1])}
    return out


def bubble(cfg: TrainConfig, ctx: launch.DistContext, schedule: str, micro_batches: list[int]) -> dict:
    """For each m: the median over a few steps of the measured idle share, and the model's; and the
    timeline of the median step (every stage's operations, seconds from the step's common start: the
    figures of the page draw them)."""
    out = {}
    for m in micro_batches:
        pipe = Pipeline(cfg, ctx, schedule, m)
        steps = []
        for repeat in range(BUBBLE_REPEATS + 1):
            record = pipe.forward_backward(repeat)
            pipe.optimizer.zero_grad(set_to_none=True)
            records = [None] * ctx.world_size
            dist.all_gather_object(records, record)
            if repeat:  # the first step warms the allocator and the connections up
                steps.append((bubble_fraction(records), records))
        steps.sort(key=lambda found: found[0])
        median, records = steps[len(steps) // 2]
        out[str(m)] = {
            "measured": median,
            "model": za.bubble_fraction(ctx.world_size, m),
            "timeline": [[[k, i, round(a, 6), round(b, 6)] for k, i, a, b in r.ops] for r in records],
            "waited_s": [round(r.waited_s, 6) for r in records],
        }
    return out


def train(cfg: TrainConfig, args: argparse.Namespace, ctx: launch.DistContext, check: bool, steps: int) -> dict:
    """Train the pipeline for ``steps`` of the run's steps; with ``check``, the step drift at every step
    against one process (the twin clips with the pipeline's norm) and the tied copies compared."""
    from tqdm import tqdm

    pipe = Pipeline(cfg, ctx, args.schedule, args.micro_batches)
    watch = Watch(pipe.stage, cfg)
    sent, seconds, tied = [], [0.0], [True]
    bar = tqdm(
        total=steps,
        desc=f"[rank 0] train (pipeline of {pipe.stages}, {args.schedule}, m={args.micro_batches}, {cfg.dtype})",
        disable=args.quiet or not ctx.is_main,
        dynamic_ncols=True,
        file=sys.stdout,
    )

    class Timed:
        """The pipeline, its bytes and seconds counted step by step."""

        def train_step(self, step: int):
            pipe.counter.reset()
            t0 = time.perf_counter()
            out = pipe.train_step(step)
            seconds[0] += time.perf_counter() - t0
            sent.append(pipe.counter.sent)
            if check:
                tied[0] &= tied_copies_identical(pipe)
            return out

        whole_state = staticmethod(pipe.whole_state)

    def on_step(step: int, loss: float, run: proof.DriftRun) -> None:
        watch.after_step(step, loss)
        bar.update(1)
        if ctx.is_main:
            shown = {"step drift": f"{run.drift.final:.1e}"} if check and run.drift.values else {}
            bar.set_postfix({"loss": f"{loss:.4f}", **shown})

    run = proof.run_with_twin(Timed(), cfg, ctx, twin_norm="run", on_step=on_step, check=check, steps=steps)
    bar.close()
    per_rank = [None] * ctx.world_size
    dist.all_gather_object(per_rank, sent[-1])
    result = {
        "steps": steps,
        "schedule_steps": cfg.steps,
        "dtype": cfg.dtype,
        "final_loss": run.losses[-1],
        "seconds_per_step": seconds[0] / steps,
        "bytes_sent_per_step": per_rank,
        "step_drift": run.summary() if check else None,
        "tied_copies_bit_identical": tied[0] if check else None,
    }
    state = pipe.whole_state()
    full = build_model(cfg)  # on the CPU: the tutor's scorer feeds the model CPU batches
    full.load_state_dict(state["weights"])
    result.update(entry.tutor_score(full, args, cfg.block_size, ctx))  # every rank has the whole model
    return result


# ----------------------------------------------------------------------------------------------
# The command line


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = cli.torchrun_parser(PROG, __doc__)
    p.add_argument("--schedule", choices=tuple(SCHEDULES), default="1f1b", help="the order of the micro-batches")
    p.add_argument(
        "--micro-batches", type=cli.POSITIVE_INT, default=8, help="micro-batches per step (must divide the batch of 64)"
    )
    p.add_argument("--steps", type=cli.POSITIVE_INT, default=TrainConfig().steps, help="training steps")
    p.add_argument("--seed", type=cli.SEED, default=0, help="the weights and the batches")
    entry.add_check_flags(p, check_steps=DEFAULT_CHECK_STEPS)
    p.add_argument(
        "--bubble-micro-batches",
        type=cli.POSITIVE_INT,
        nargs="+",
        default=[1, 2, 4, 8],
        help="--check: the values of m whose bubble is measured",
    )
    p.add_argument(
        "--test-sentences", type=cli.POSITIVE_INT, default=None, help="tutor accuracy on this many test sentences"
    )
    entry.add_run_flags(p)
    cli.add_device_flag(p)
    return p.parse_args(argv)


def check_args(args: argparse.Namespace, world_size: int) -> TrainConfig:
    """The settings, or ValueError naming the value that cannot work and what would."""
    cfg = TrainConfig(steps=args.steps, seed=args.seed)
    if world_size > cfg.n_layer:
        raise ValueError(
            f"the world size {world_size} is one stage per rank, but MiniGPT has {cfg.n_layer} blocks: "
            f"use 1 to {cfg.n_layer} ranks"
        )
    for flag, values in (
        ("--micro-batches", [args.micro_batches]),
        ("--bubble-micro-batches", args.bubble_micro_batches),
    ):
        for m in values:
            if cfg.batch_size % m:
                raise ValueError(
                    f"{flag} {m} does not divide the batch of {cfg.batch_size} sequences: use a divisor of it"
                )
    if args.check:
        cli.need_world_size(world_size, 2, "--check compares a pipeline of 2 stages or more with one process")
    return cfg


def measure(cfg: TrainConfig, args: argparse.Namespace, ctx: launch.DistContext) -> dict:
    t_start = time.perf_counter()
    p = ctx.world_size
    trained = entry.steps_trained(args, cfg.steps)
    shape_pipe = Pipeline(cfg, ctx, args.schedule, args.micro_batches)  # checks the schedule first
    launch.log(
        ctx,
        f"MiniGPT {build_model(cfg).num_params():,} parameters | {p} stages ({ctx.backend}) | {args.schedule}, "
        f"{args.micro_batches} micro-batches of {cfg.batch_size // args.micro_batches} | {trained} of {cfg.steps} "
        f"steps | implementation: {impl.current()}\n{chart(shape_pipe.played)}",
    )
    del shape_pipe
    vocab = cfg.model_config().vocab_size
    report: dict = {
        "world_size": p,
        "stages": p,
        "micro_batches": args.micro_batches,
        "schedule": args.schedule,
        "implementation": impl.current(),
        "full": bool(args.full),
        "blocks_per_stage": [len(PipelineStage(build_model(cfg), s, p).block_ids) for s in range(p)],
        "bytes_model": [step_bytes_model(p, s, cfg.batch_size, cfg.block_size, cfg.n_embd, vocab, 4) for s in range(p)],
    }
    check = proof.Proof(proof.DATA_PARALLEL, twin_norm="run", report=report)
    if args.check:
        one = {
            "float32": one_step(cfg, ctx, args.micro_batches),
            "float64": one_step(replace(cfg, dtype="float64"), ctx, args.micro_batches),
        }
        report["one_step"] = one
        check.first_step(lambda c: Pipeline(c, ctx, args.schedule, args.micro_batches), cfg, ctx)
        report["fp32_first_step_grad_diff"] = max(
            report["fp32_first_step_grad_diff"], *(one["float32"][s]["max_grad_diff"] for s in SCHEDULES)
        )
        check.float64(lambda c: Pipeline(c, ctx, args.schedule, args.micro_batches), cfg, ctx, args.fp64_steps)
        report["torch_pipelining"] = torch_pipelining(cfg, ctx, args.micro_batches)
        report["max_grad_diff"] = max(one["float32"][s]["max_grad_diff"] for s in SCHEDULES)
        report["peak_activations"] = {s: one["float32"][s]["peak_activations"] for s in SCHEDULES}
        report["peak_activations_expected"] = {s: one["float32"][s]["peak_activations_expected"] for s in SCHEDULES}
        launch.log(
            ctx,
            f"one step: logits {report['fp32_first_step_logit_diff']:.1e}, gradients {report['max_grad_diff']:.1e} "
            f"from one process | float64: step drift {report['fp64_max_step_drift']:.1e} over {report['fp64_steps']} "
            f"steps | bytes per stage {one['float32'][args.schedule]['bytes_sent']} (model {report['bytes_model']}) | "
            f"micro-batches held at most: GPipe {report['peak_activations']['gpipe']}, 1F1B "
            f"{report['peak_activations']['1f1b']}; now the bubble",
        )
        report["bubble"] = {s: bubble(cfg, ctx, s, args.bubble_micro_batches) for s in SCHEDULES}
        report["bubble_measured"] = {m: v["measured"] for m, v in report["bubble"][args.schedule].items()}
        report["bubble_model"] = {m: v["model"] for m, v in report["bubble"][args.schedule].items()}
    report["training"] = train(cfg, args, ctx, args.check, trained)
    t = report["training"]
    report.update(tutor_accuracy=t.get("tutor_accuracy"), bytes_per_stage_per_step=t["bytes_sent_per_step"])
    if args.check:
        check.float32(t["step_drift"])
        report.update(
            tied_copies_bit_identical=t["tied_copies_bit_identical"],
            pytorch_impl="torch.distributed.pipelining (ScheduleGPipe, Schedule1F1B)",
            pytorch_max_diff=max(v["max_grad_diff"] for v in report["torch_pipelining"].values()),
            same_as_pytorch=all(v["bit_identical"] for v in report["torch_pipelining"].values()),
        )
        report.update(verdict(report).keys())
    return entry.finish(report, args, ctx, summary, t_start)


def verdict(report: dict) -> proof.Verdict:
    """Lab 06's pipeline rulers: the harness's three, PyTorch's pipelining, bytes, activations, ties."""
    v = proof.Proof(proof.DATA_PARALLEL, twin_norm="run", report=report).judge()
    one = report["one_step"]
    v.at_most(
        "fp64_first_step_grad_diff",
        max(one["float64"][s]["max_grad_diff"] for s in SCHEDULES),
        proof.FP64_DRIFT_BOUND,
        "GPipe and 1F1B",
    )
    v.true("same_as_pytorch", report["same_as_pytorch"], "gradients bit-identical to torch.distributed.pipelining")
    for s in SCHEDULES:
        v.equal(f"one_step.{s}.bytes_sent", one["float32"][s]["bytes_sent"], report["bytes_model"], "per stage")
    v.equal("bytes_per_stage_per_step", report["bytes_per_stage_per_step"], report["bytes_model"], "training")
    v.equal("peak_activations", report["peak_activations"], report["peak_activations_expected"], "GPipe m, 1F1B p-s")
    v.true("tied_copies_bit_identical", report["tied_copies_bit_identical"], "the tied matrix's two copies")
    return v


def summary(report: dict) -> list[str]:
    t = report["training"]
    lines = [
        f"final: step {t['steps']} of {t['schedule_steps']} | loss {t['final_loss']:.4f} | tutor accuracy "
        f"{100 * t['tutor_accuracy']:.1f}% ({t['tutor_correct']}/{t['tutor_total']}) | bytes per stage per step "
        f"{report['bytes_per_stage_per_step']} (model {report['bytes_model']})"
    ]
    if report.get("rulers"):
        bubbles = ", ".join(
            f"m={m} {v:.2f} (model {report['bubble_model'][m]:.2f})" for m, v in report["bubble_measured"].items()
        )
        lines.append(
            f"bubble ({report['schedule']}, measured, not a criterion): {bubbles} | against "
            "torch.distributed.pipelining: "
            + ", ".join(
                f"{k} {v['max_grad_diff']:.1e}{' (bit-identical)' if v['bit_identical'] else ''}"
                for k, v in report["torch_pipelining"].items()
            )
        )
        lines += proof.Verdict.of(report).lines()
    return lines


def measure_or_timeout(cfg: TrainConfig, args: argparse.Namespace, ctx: launch.DistContext) -> dict:
    """A receive that waited past the timeout ends every rank with the line that names who waited for what."""
    try:
        return measure(cfg, args, ctx)
    except PipelineTimeout as exc:
        launch.fail(ctx, str(exc))


LAB = entry.Lab(
    PROG,
    parse_args,
    check_args,
    measure_or_timeout,
    "minigpt.pages.lab06:render",
    ("training", "stages"),
    "lab/results/06-pipeline-cpu.json",
)


def main(argv: list[str] | None = None) -> int:
    return entry.main(LAB, argv)
