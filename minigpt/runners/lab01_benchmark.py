"""Lab 01's benchmark: how fast is each way of doing data parallelism? A script, not a test.

    torchrun --nproc_per_node=2 lab/01_benchmark.py --out lab/results

Every measurement times whole training steps (forward, backward, gradient synchronisation,
clipping, optimizer step) on two ranks. Contenders *take turns*: a round runs each one for
``--steps`` timed steps, in an order that rotates from round to round, and a contender's round
time is the median of its steps. A slow moment of the machine then hits all of them alike, and
the ratio of two contenders is taken *within* each round; the tables give the median of those
ratios over ``--repeats`` rounds, with their range.

1. **MiniGPT** at the lab's cap (0.5 MiB): one process on the whole batch, a naive DDP (one
   blocking all-reduce per gradient after backward), the hand-rolled
   :class:`~minigpt.parallel.ddp.BucketedDDP` and PyTorch's ``DistributedDataParallel``; then a
   bucket-cap sweep of the hand-rolled DDP, and the timeline of one step.
2. **Other models** (:data:`SHAPES`: MiniGPT, a deep MLP stack, a wide shallow MLP, many small
   layers), each at every cap in :data:`CAPS_MB`: the hand-rolled DDP against PyTorch's.
3. **What each choice bought**: the versions of :mod:`minigpt.parallel.ddp_steps`, from the course's
   first DDP to the reference, each against PyTorch's DDP, on every shape at 1 MiB.

Results go to ``<out>/01-benchmark-<device>.json``; ``--render FILE.json`` turns a JSON into the
tables (English and Spanish Markdown) and the timeline figures the lab page includes, without
re-measuring (:mod:`minigpt.pages.lab01_benchmark`).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from minigpt import cli, grammar
from minigpt.parallel import launch
from minigpt.parallel.ddp import BucketedDDP
from minigpt.parallel.ddp_steps import VERSIONS, NaiveDDP
from minigpt.runners import entry
from minigpt.train import TrainConfig, build_model, build_optimizer

PROG = "lab/01_benchmark.py"
VARIANTS = ("one process", "naive", "bucketed", "torch-ddp")
SWEEP_MB = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 25.0)
CAPS_MB = (0.25, 1.0, 5.0, 25.0)
ABLATION_CAP_MB = 1.0
GLOBAL_ROWS = 64  # the global batch of every shape: 32 rows per rank
RESULT_KEYS = ("device", "repeats")  # what every result of this script holds (--render checks it)


# ----------------------------------------------------------------------------------------------
# The models


@dataclass
class Shape:
    """A model to benchmark: how to build it (seeded), and the loss of one rank's batch."""

    name: str
    build: Callable[[], nn.Module]
    loss: Callable[[nn.Module, int, int], torch.Tensor]  # (model or its wrapper, rank, world size)


def _mlp_loss(width: int):
    def loss(model: nn.Module, rank: int, world_size: int) -> torch.Tensor:
        x = torch.randn(GLOBAL_ROWS, width, generator=torch.Generator().manual_seed(0))
        rows = grammar.rank_slice(GLOBAL_ROWS, rank, world_size)
        return model(x[rows]).square().mean()

    return loss


def _minigpt_loss(model: nn.Module, rank: int, world_size: int) -> torch.Tensor:
    x, y, mask = grammar.get_batch("train", 0, GLOBAL_ROWS, rank, world_size)
    return model(x, y, mask)[1]


def _seeded(make: Callable[[], nn.Module]) -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        torch.manual_seed(0)
        return make()

    return build


SHAPES: dict[str, Shape] = {
    "minigpt": Shape("minigpt", lambda: build_model(TrainConfig()), _minigpt_loss),
    # ~7.1M parameters, 28 MB of gradients in 24 tensors: six Linear(384,1536)-GELU-Linear(1536,384) blocks
    "deep-mlp": Shape(
        "deep-mlp",
        _seeded(
            lambda: nn.Sequential(
                *[nn.Sequential(nn.Linear(384, 1536), nn.GELU(), nn.Linear(1536, 384)) for _ in range(6)]
            )
        ),
        _mlp_loss(384),
    ),
    # ~6.3M parameters in 4 tensors: one hidden layer 8192 wide
    "wide-shallow": Shape(
        "wide-shallow",
        _seeded(lambda: nn.Sequential(nn.Linear(384, 8192), nn.GELU(), nn.Linear(8192, 384))),
        _mlp_loss(384),
    ),
    # ~0.43M parameters in 400 tensors: a hundred LayerNorm(64)-Linear(64,64) layers
    "many-small": Shape(
        "many-small",
        _seeded(
            lambda: nn.Sequential(*[nn.Sequential(nn.LayerNorm(64), nn.Linear(64, 64), nn.GELU()) for _ in range(100)])
        ),
        _mlp_loss(64),
    ),
}


# ----------------------------------------------------------------------------------------------
# Contenders and the interleaved timer


class Contender:
    """One way of training ``shape``: its model, wrapper and optimizer, and its step."""

    def __init__(self, shape: Shape, how: str, cap_mb: float, ctx: launch.DistContext):
        self.shape, self.how, self.ctx = shape, how, ctx
        self.model = shape.build()
        if how == "naive":
            self.wrapped = NaiveDDP(self.model)
        elif how == "torch-ddp":
            self.wrapped = nn.parallel.DistributedDataParallel(self.model, bucket_cap_mb=cap_mb)
        elif how == "one process":
            self.wrapped = self.model
        else:  # "bucketed" (the reference) or one of ddp_steps.VERSIONS
            self.wrapped = VERSIONS.get(how, BucketedDDP)(self.model, bucket_cap_mb=cap_mb)
        cfg = TrainConfig()
        self.optimizer = (
            build_optimizer(self.model, cfg)
            if shape.name == "minigpt"
            else torch.optim.AdamW(self.model.parameters(), lr=1e-4)
        )

    def step(self) -> None:
        one = self.how == "one process"
        loss = self.shape.loss(self.wrapped, 0 if one else self.ctx.rank, 1 if one else self.ctx.world_size)
        loss.backward()
        if isinstance(self.wrapped, NaiveDDP):
            self.wrapped.synchronise()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def time(self, steps: int) -> float:
        """Median seconds of ``steps`` steps (rank 0's clock; the ranks start together). "one
        process" runs on rank 0 alone while the others wait."""
        dist.barrier()
        times = []
        if self.how != "one process" or self.ctx.rank == 0:
            for _ in range(steps):
                t0 = time.perf_counter()
                self.step()
                times.append(time.perf_counter() - t0)
        dist.barrier()
        return statistics.median(times) if times else 0.0


def take_turns(
    contenders: dict[str, Contender], rounds: int, steps: int, warmup: int, ctx: launch.DistContext, label: str = ""
) -> dict[str, list[float]]:
    """Each contender's median step time in each of ``rounds`` rounds, the contenders taking turns
    (the order rotates every round). Warm-up first: the allocator, and PyTorch's DDP rebuilds its
    buckets after its first step."""
    for contender in contenders.values():
        contender.time(warmup)
    names = list(contenders)
    times: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            times[name].append(contenders[name].time(steps))
    if label:
        launch.log(ctx, f"{label}: " + ", ".join(f"{n} {1000 * statistics.median(t):.1f} ms" for n, t in times.items()))
    return times


def ratios(times: dict[str, list[float]], name: str, baseline: str = "torch-ddp") -> dict:
    """``name``'s time over ``baseline``'s, round by round: median, min and max."""
    per_round = [a / b for a, b in zip(times[name], times[baseline])]
    return {
        "median": statistics.median(per_round),
        "min": min(per_round),
        "max": max(per_round),
        "per_round": per_round,
    }


# ----------------------------------------------------------------------------------------------
# The three parts


def measure_minigpt(args: argparse.Namespace, ctx: launch.DistContext) -> dict:
    shape = SHAPES["minigpt"]
    contenders = {v: Contender(shape, v, args.bucket_cap_mb, ctx) for v in VARIANTS}
    times = take_turns(contenders, args.repeats, args.steps, args.warmup, ctx, "MiniGPT")
    sweep = []
    for cap in SWEEP_MB:
        one = {"bucketed": Contender(shape, "bucketed", cap, ctx)}
        median = statistics.median(take_turns(one, max(1, args.repeats // 2), args.steps, args.warmup, ctx)["bucketed"])
        sweep.append({"bucket_cap_mb": cap, "buckets": len(one["bucketed"].wrapped.buckets), "median_s": median})
    # the timeline of one step of the hand-rolled DDP at the lab's cap
    main = contenders["bucketed"]
    dist.barrier()
    loss = shape.loss(main.wrapped, ctx.rank, ctx.world_size)
    backward_start = main.wrapped._now()
    loss.backward()
    backward_end = main.wrapped._now()
    timeline = {
        "backward_start_s": backward_start,
        "backward_end_s": backward_end,
        "buckets": main.wrapped.last_timeline(),
        "layout": main.wrapped.bucket_layout(),
    }
    main.optimizer.zero_grad(set_to_none=True)
    return {
        "bucket_cap_mb": args.bucket_cap_mb,
        "medians_s": {v: statistics.median(t) for v, t in times.items()},
        "rounds_s": times,
        "sweep": sweep,
        "timeline": timeline,
    }


def describe(model: nn.Module) -> dict:
    params = [p for p in model.parameters() if p.requires_grad]
    return {
        "parameters": sum(p.numel() for p in params),
        "tensors": len(params),
        "gradient_bytes": sum(p.numel() * p.element_size() for p in params),
    }


def measure_shapes(args: argparse.Namespace, ctx: launch.DistContext) -> dict:
    out = {}
    for name in args.shapes:
        shape = SHAPES[name]
        per_cap = []
        for cap in CAPS_MB:
            contenders = {how: Contender(shape, how, cap, ctx) for how in ("bucketed", "torch-ddp")}
            times = take_turns(contenders, args.repeats, args.steps, args.warmup, ctx, f"{name}, {cap:g} MiB")
            per_cap.append(
                {
                    "bucket_cap_mb": cap,
                    "buckets": len(contenders["bucketed"].wrapped.buckets),
                    "medians_s": {h: statistics.median(t) for h, t in times.items()},
                    "ratio": ratios(times, "bucketed"),
                }
            )
        out[name] = {**describe(shape.build()), "caps": per_cap}
    return out


def measure_ablation(args: argparse.Namespace, ctx: launch.DistContext) -> dict:
    out = {}
    for name in args.shapes:
        shape = SHAPES[name]
        contenders = {v: Contender(shape, v, ABLATION_CAP_MB, ctx) for v in VERSIONS}
        contenders["torch-ddp"] = Contender(shape, "torch-ddp", ABLATION_CAP_MB, ctx)
        times = take_turns(contenders, args.repeats, args.steps, args.warmup, ctx, f"versions, {name}")
        out[name] = {
            v: {
                "median_s": statistics.median(times[v]),
                "ratio": ratios(times, v),
                "buckets": len(contenders[v].wrapped.buckets),
            }
            for v in VERSIONS
        }
        out[name]["torch-ddp"] = {"median_s": statistics.median(times["torch-ddp"])}
    return out


# ----------------------------------------------------------------------------------------------
# The command line


def main(argv: list[str] | None = None) -> int:
    p = cli.torchrun_parser(PROG, __doc__, nproc="2")
    p.add_argument("--steps", type=cli.POSITIVE_INT, default=8, help="timed steps per contender per round")
    p.add_argument("--repeats", type=cli.POSITIVE_INT, default=21, help="rounds; the tables show the median over them")
    p.add_argument("--warmup", type=cli.NON_NEGATIVE_INT, default=3, help="untimed steps per contender first")
    p.add_argument("--bucket-cap-mb", type=cli.MIB, default=0.5, help="the cap of part 1 (MiniGPT)")
    p.add_argument("--parts", default="minigpt,shapes,ablation", help="which parts to run, comma-separated")
    p.add_argument("--shapes", default=",".join(SHAPES), help=f"the models of parts 2 and 3, from {', '.join(SHAPES)}")
    p.add_argument("--out", default="out", help="folder for 01-benchmark-<device>.json and its renders")
    p.add_argument("--render", metavar="JSON", help="only render an existing result (no measuring)")
    cli.add_device_flag(p)
    args = p.parse_args(argv)
    from minigpt.pages.lab01_benchmark import render

    try:
        if args.render:
            for path in render(
                cli.input_json(args.render, "--render", RESULT_KEYS, "lab/results/01-benchmark-cpu.json")
            ):
                print(f"wrote {path}")
            return 0
        args.parts = [x.strip() for x in args.parts.split(",") if x.strip()]
        args.shapes = [x.strip() for x in args.shapes.split(",") if x.strip()]
        for value, valid, flag in (
            (args.parts, ("minigpt", "shapes", "ablation"), "--parts"),
            (args.shapes, tuple(SHAPES), "--shapes"),
        ):
            wrong = [v for v in value if v not in valid]
            if wrong or not value:
                raise cli.BadInput(f"{flag} {','.join(value) or '(empty)'}: choose from {', '.join(valid)}")
        cli.output_dir(args.out, "--out")  # rank 0 writes the results; every rank checks, so that all refuse
        _, _, world_size = launch.torchrun_env()  # the values are valid: can this world run them?
        cli.need_world_size(world_size, 2, "the benchmark compares data-parallel variants")
        cli.divisible_by_world(None, GLOBAL_ROWS, world_size)

        def accepts(n: int) -> None:
            cli.need_world_size(n, 2, "the benchmark compares data-parallel variants")
            cli.divisible_by_world(None, GLOBAL_ROWS, n)

        where = entry.placement(PROG, args, argv, world_size, accepts)
    except cli.BadInput as exc:
        return cli.refuse(PROG, str(exc))
    ctx = entry.start(args, where, launch.DEFAULT_TIMEOUT_S)
    torch.set_num_threads(1)
    result = {
        "device": f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} thread(s) per process",
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "backend": ctx.backend,
        "world_size": ctx.world_size,
        "date": time.strftime("%Y-%m-%d"),
        "steps": args.steps,
        "repeats": args.repeats,
        "ablation_cap_mb": ABLATION_CAP_MB,
    }
    if "minigpt" in args.parts:
        result.update(launch.run(ctx, PROG, lambda: measure_minigpt(args, ctx)))
    if "shapes" in args.parts:
        result["shapes"] = launch.run(ctx, PROG, lambda: measure_shapes(args, ctx))
    if "ablation" in args.parts:
        result["ablation"] = launch.run(ctx, PROG, lambda: measure_ablation(args, ctx))
    if ctx.is_main:
        out = cli.make_parents(args.out, is_dir=True)
        path = out / f"01-benchmark-{'gpu' if ctx.device.type == 'cuda' else 'cpu'}.json"
        path.write_text(json.dumps(result, indent=2) + "\n")
        for written in [path, *render(path)]:
            launch.log(ctx, f"wrote {written}")
    launch.teardown()
    return 0
