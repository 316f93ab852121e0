"""Lab 01's benchmark: how fast is each way of doing data parallelism? A script, not a test.

    torchrun --nproc_per_node=2 lab/01_benchmark.py --out lab/results

Times one MiniGPT training step (forward, backward, gradient synchronisation, clipping, AdamW)
on the same global batch, for:

* ``one process``   - the whole global batch in a single process (rank 0; rank 1 waits);
* ``naive``         - every gradient all-reduced one by one after backward: no buckets, no overlap;
* ``bucketed``      - the hand-rolled :class:`~minigpt.dist.ddp.BucketedDDP`;
* ``torch-ddp``     - PyTorch's ``DistributedDataParallel`` with the same bucket cap.

The variants take turns (``--repeats`` rounds of ``--steps`` timed steps each, after warm-up), so
a slow moment of the machine hits all of them alike; the table gives the median step time of
each and its ratio to PyTorch's DDP. Then a bucket-cap sweep of the bucketed DDP, and the
timeline of one step (each bucket's gradients being produced, and its all-reduce in flight).

Results go to ``<out>/01-benchmark-<device>.json``; ``--render FILE.json`` turns a JSON into the
tables (English and Spanish Markdown) and the timeline figures the lab page includes, without
re-measuring.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

from minigpt import grammar
from minigpt.dist import launch
from minigpt.dist.ddp import BucketedDDP
from minigpt.train import TrainConfig, build_model, build_optimizer

VARIANTS = ("one process", "naive", "bucketed", "torch-ddp")
SWEEP_MB = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 25.0)


class NaiveDDP(torch.nn.Module):
    """The baseline DDP improves on: after backward, one blocking all-reduce per gradient."""

    def __init__(self, module: torch.nn.Module):
        super().__init__()
        self.module = module
        for tensor in [*module.parameters(), *module.buffers()]:
            dist.broadcast(tensor.data, src=0)

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def synchronise(self) -> None:
        world = dist.get_world_size()
        for p in self.module.parameters():
            if p.grad is not None:
                p.grad.div_(world)
                dist.all_reduce(p.grad)


def make(variant: str, cfg: TrainConfig, cap_mb: float):
    model = build_model(cfg)
    if variant == "naive":
        wrapped = NaiveDDP(model)
    elif variant == "bucketed":
        wrapped = BucketedDDP(model, bucket_cap_mb=cap_mb)
    elif variant == "torch-ddp":
        from torch.nn.parallel import DistributedDataParallel
        wrapped = DistributedDataParallel(model, bucket_cap_mb=cap_mb)
    else:
        wrapped = model
    return model, wrapped, build_optimizer(model, cfg)


def step_once(wrapped, model, optimizer, batch, cfg: TrainConfig) -> None:
    _, loss = wrapped(*batch)
    loss.backward()
    if isinstance(wrapped, NaiveDDP):
        wrapped.synchronise()
    torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def time_steps(variant: str, built, batch, steps: int, cfg: TrainConfig, ctx) -> list[float]:
    """Per-step seconds of ``steps`` steps (rank 0's clock; the ranks start together)."""
    model, wrapped, optimizer = built
    dist.barrier()
    times = []
    if variant != "one process" or ctx.rank == 0:  # one process: rank 0 alone, the others wait
        for _ in range(steps):
            t0 = time.perf_counter()
            step_once(wrapped, model, optimizer, batch, cfg)
            times.append(time.perf_counter() - t0)
    dist.barrier()
    return times


def measure(args: argparse.Namespace, ctx) -> dict:
    cfg = TrainConfig()
    global_batch = grammar.get_batch("train", 0, cfg.batch_size)
    local_batch = grammar.get_batch("train", 0, cfg.batch_size, ctx.rank, ctx.world_size)
    built = {v: make(v, cfg, args.bucket_cap_mb) for v in VARIANTS}
    batches = {v: global_batch if v == "one process" else local_batch for v in VARIANTS}
    for v in VARIANTS:  # warm-up: allocator, first-iteration bookkeeping (PyTorch's DDP rebuilds buckets)
        time_steps(v, built[v], batches[v], args.warmup, cfg, ctx)
    rounds: dict[str, list[float]] = {v: [] for v in VARIANTS}
    for r in range(args.repeats):
        for v in VARIANTS:
            times = time_steps(v, built[v], batches[v], args.steps, cfg, ctx)
            if ctx.rank == 0:
                rounds[v].append(statistics.median(times))
        launch.log(ctx, f"round {r + 1}/{args.repeats}: " + ", ".join(
            f"{v} {1000 * rounds[v][-1]:.1f} ms" for v in VARIANTS if rounds[v]))
    sweep = []
    for cap in SWEEP_MB:
        built_cap = make("bucketed", cfg, cap)
        time_steps("bucketed", built_cap, local_batch, args.warmup, cfg, ctx)
        medians = [statistics.median(time_steps("bucketed", built_cap, local_batch, args.steps, cfg, ctx))
                   for _ in range(max(1, args.repeats // 2))]
        sweep.append({"bucket_cap_mb": cap, "buckets": len(built_cap[1].buckets), "median_s": statistics.median(medians)})
        launch.log(ctx, f"sweep: cap {cap:g} MiB, {len(built_cap[1].buckets)} buckets, {1000 * sweep[-1]['median_s']:.1f} ms")
    # the timeline of one step of the bucketed DDP at the lab's cap
    model, wrapped, optimizer = built["bucketed"]
    dist.barrier()
    _, loss = wrapped(*local_batch)
    backward_start = wrapped._now()
    loss.backward()
    backward_end = wrapped._now()
    timeline = {"backward_start_s": backward_start, "backward_end_s": backward_end,
                "buckets": wrapped.last_timeline(), "layout": wrapped.bucket_layout()}
    optimizer.zero_grad(set_to_none=True)
    if ctx.rank != 0:
        return {}
    return {
        "device": f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} thread(s) per process",
        "cpu_count": __import__("os").cpu_count(), "torch": torch.__version__, "backend": ctx.backend,
        "world_size": ctx.world_size, "date": time.strftime("%Y-%m-%d"), "steps": args.steps,
        "repeats": args.repeats, "bucket_cap_mb": args.bucket_cap_mb,
        "medians_s": {v: statistics.median(rounds[v]) for v in VARIANTS},
        "rounds_s": rounds, "sweep": sweep, "timeline": timeline,
    }


# ----------------------------------------------------------------------------------------------
# rendering: tables and the timeline figure, in English and Spanish

LABELS = {
    "en": {"variant": "variant", "median": "median step (ms)", "ratio": "vs PyTorch DDP (median of rounds)",
           "range": "range over rounds",
           "cap": "bucket cap (MiB)", "buckets": "buckets", "one process": "one process (whole batch)",
           "naive": "naive (per-gradient all-reduce after backward)", "bucketed": "hand-rolled BucketedDDP",
           "torch-ddp": "PyTorch DistributedDataParallel", "xlabel": "ms since the forward pass started",
           "ylabel": "bucket", "grads": "gradients produced (backward)", "reduce": "all-reduce in flight",
           "bwd": "loss.backward() returns", "bwd_start": "loss.backward() called", "title": "One step of BucketedDDP, {n} ranks"},
    "es": {"variant": "variante", "median": "paso, mediana (ms)", "ratio": "frente a DDP de PyTorch (mediana de rondas)",
           "range": "rango en las rondas",
           "cap": "tope del bucket (MiB)", "buckets": "buckets", "one process": "un proceso (lote entero)",
           "naive": "ingenua (all-reduce por gradiente tras el backward)", "bucketed": "BucketedDDP hecho a mano",
           "torch-ddp": "DistributedDataParallel de PyTorch", "xlabel": "ms desde el inicio del forward",
           "ylabel": "bucket", "grads": "gradientes calculados (backward)", "reduce": "all-reduce en curso",
           "bwd": "loss.backward() retorna", "bwd_start": "se llama a loss.backward()", "title": "Un paso de BucketedDDP, {n} ranks"},
}


def number(value: float, lang: str, digits: int = 1) -> str:
    text = f"{value:.{digits}f}"
    return text.replace(".", ",") if lang == "es" else text


def render_tables(result: dict, lang: str) -> str:
    L = LABELS[lang]
    rounds = result["rounds_s"]
    rows = [f"| {L['variant']} | {L['median']} | {L['ratio']} | {L['range']} |", "| --- | ---: | ---: | ---: |"]
    for v in VARIANTS:
        # the variants take turns, so a round's ratio compares runs made seconds apart
        ratios = [a / b for a, b in zip(rounds[v], rounds["torch-ddp"])]
        spread = f"{number(min(ratios), lang, 2)}–{number(max(ratios), lang, 2)}"
        rows.append(f"| {L[v]} | {number(1000 * result['medians_s'][v], lang)} | "
                    f"{number(statistics.median(ratios), lang, 2)} | {spread} |")
    rows += ["", f"| {L['cap']} | {L['buckets']} | {L['median']} |", "| ---: | ---: | ---: |"]
    for s in result["sweep"]:
        rows.append(f"| {number(s['bucket_cap_mb'], lang, 2)} | {s['buckets']} | {number(1000 * s['median_s'], lang)} |")
    return "\n".join(rows) + "\n"


def render_timeline(result: dict, lang: str, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    L, t = LABELS[lang], result["timeline"]
    fig, ax = plt.subplots(figsize=(8, 0.6 * len(t["buckets"]) + 2.4))
    for b in t["buckets"]:
        y = b["bucket"]
        ax.barh(y + 0.18, 1000 * (b["last_ready_s"] - b["first_ready_s"]) + 0.05, left=1000 * b["first_ready_s"],
                height=0.32, color="#5c6bc0", label=L["grads"] if y == 0 else None)
        ax.barh(y - 0.18, 1000 * (b["done_s"] - b["launched_s"]), left=1000 * b["launched_s"], height=0.32,
                color="#ef6c00", label=L["reduce"] if y == 0 else None)
    ax.axvline(1000 * t["backward_start_s"], color="grey", linestyle=":", linewidth=1, label=L["bwd_start"])
    ax.axvline(1000 * t["backward_end_s"], color="black", linestyle="--", linewidth=1, label=L["bwd"])
    ax.set_yticks([b["bucket"] for b in t["buckets"]])
    ax.invert_yaxis()
    ax.set_xlabel(L["xlabel"])
    ax.set_ylabel(L["ylabel"])
    ax.set_title(L["title"].format(n=result["world_size"]))
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.22), ncol=2, fontsize=8, frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def render(json_path: Path) -> list[Path]:
    """``X.json`` -> ``X-en.txt``, ``X-es.txt`` (Markdown tables) and ``X-timeline-en.png``, ``-es.png``."""
    result = json.loads(json_path.read_text())
    written = []
    for lang in ("en", "es"):
        table = json_path.with_name(f"{json_path.stem}-{lang}.txt")  # a fragment the page includes, not a page
        table.write_text(render_tables(result, lang))
        figure = json_path.with_name(f"{json_path.stem}-timeline-{lang}.png")
        render_timeline(result, lang, figure)
        written += [table, figure]
    return written


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="torchrun --nproc_per_node=2 lab/01_benchmark.py", description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=20, help="timed steps per variant per round")
    p.add_argument("--repeats", type=int, default=5, help="rounds; the table shows the median of the round medians")
    p.add_argument("--warmup", type=int, default=5, help="untimed steps per variant first")
    p.add_argument("--bucket-cap-mb", type=float, default=0.5, help="bucket cap of bucketed and torch-ddp")
    p.add_argument("--out", default="out", help="folder for 01-benchmark-<device>.json and its renders")
    p.add_argument("--render", metavar="JSON", help="only render an existing result (no measuring)")
    args = p.parse_args(argv)
    if args.render:
        for path in render(Path(args.render)):
            print(f"wrote {path}")
        return 0
    for name in ("steps", "repeats"):
        if getattr(args, name) < 1:
            print(f"{p.prog}: error: --{name} must be at least 1, got {getattr(args, name)}", file=sys.stderr)
            return 2
    if not args.bucket_cap_mb > 0:
        print(f"{p.prog}: error: --bucket-cap-mb must be positive, got {args.bucket_cap_mb}", file=sys.stderr)
        return 2
    ctx = launch.init()
    if ctx.world_size < 2:
        launch.fail(ctx, "the benchmark compares data-parallel variants: start it with torchrun "
                         "--nproc_per_node=2 (or more)", code=2)
    result = measure(args, ctx)
    if ctx.is_main:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        path = out / f"01-benchmark-{'gpu' if ctx.device.type == 'cuda' else 'cpu'}.json"
        path.write_text(json.dumps(result, indent=2) + "\n")
        print(render_tables(result, "en"))
        for written in [path, *render(path)]:
            launch.log(ctx, f"wrote {written}")
    launch.teardown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
