"""Lab 00's batch-scaling run: MiniGPT trained on the same 28,800 sentences at the default batch of 64
(450 steps) and at a batch of 256 (112 steps), with the learning rate kept, scaled by the square root
of the batch's growth and scaled linearly (:func:`minigpt.zero.analytic.scaled_lr`), one process each.

    python lab/00_batch_scaling.py --report lab/results/00-batch-scaling-cpu.json
    python lab/00_batch_scaling.py --render lab/results/00-batch-scaling-cpu.json

Theory page 02 puts the measured table beside the rules; :mod:`minigpt.pages.lab00_scaling` draws it.
Four trainings take a few minutes, so no check runs it.
"""

from __future__ import annotations

import platform
import sys
import time
from dataclasses import replace

from minigpt import cli

PROG = "lab/00_batch_scaling.py"
RESULT_KEYS = ("runs",)
BIG = 256  # the larger batch: four times the default


def plan() -> list[dict]:
    """The four runs: the default, then batch 256 with the learning rate kept, square-root and linear."""
    from minigpt.train import TrainConfig
    from minigpt.zero import analytic as za

    base = TrainConfig()
    steps = base.steps * base.batch_size // BIG
    warmup = base.warmup * base.batch_size // BIG
    runs = [{"rule": "default", "batch": base.batch_size, "steps": base.steps, "warmup": base.warmup, "lr": base.lr}]
    for rule in ("kept", *za.LR_RULES):
        lr = base.lr if rule == "kept" else za.scaled_lr(base.lr, base.batch_size, BIG, rule)
        runs.append({"rule": rule, "batch": BIG, "steps": steps, "warmup": warmup, "lr": lr})
    return runs


def train_one(run: dict) -> dict:
    """One training of ``run`` from the default seed; its loss and accuracy on 300 validation sentences."""
    from minigpt import grammar
    from minigpt.train import TrainConfig, build_model, build_optimizer, train_step

    base = TrainConfig()
    cfg = replace(
        base,
        batch_size=run["batch"],
        steps=run["steps"],
        warmup=run["warmup"],
        lr=run["lr"],
        min_lr=run["lr"] * base.min_lr / base.lr,
        eval_every=0,
    )
    model = build_model(cfg)
    optimizer = build_optimizer(model, cfg)
    start = time.perf_counter()
    losses = [train_step(model, optimizer, step, cfg) for step in range(cfg.steps)]
    seconds = time.perf_counter() - start
    result = grammar.score(model, "val", max_sentences=300)
    return {
        **run,
        "final_train_loss": losses[-1],
        "val_loss": result["loss"],
        "accuracy": result["accuracy"],
        "seconds": seconds,
    }


def main(argv: list[str] | None = None) -> int:
    p = cli.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    p.add_argument("--report", metavar="FILE", help="write the measurements as JSON here, and its table beside it")
    p.add_argument("--render", metavar="JSON", help="only render an existing result (no training)")
    args = p.parse_args(argv)
    from minigpt.pages.lab00_scaling import render, table

    try:
        if args.render:
            for written in render(
                cli.input_json(args.render, "--render", RESULT_KEYS, "lab/results/00-batch-scaling-cpu.json")
            ):
                print(f"wrote {written}")
            return 0
        if args.report is not None:
            cli.output_file(args.report, "--report")
    except cli.BadInput as exc:
        return cli.refuse(PROG, str(exc))
    import torch

    from minigpt.parallel import launch

    torch.set_num_threads(1)
    report = {
        "device": f"{platform.processor() or platform.machine()}, one thread",
        "torch": torch.__version__,
        "date": time.strftime("%Y-%m-%d"),
        "runs": [],
    }
    for run in plan():
        report["runs"].append(train_one(run))
        print(f"batch {run['batch']}, lr {run['lr']:.2e}: accuracy {report['runs'][-1]['accuracy']:.1%}", flush=True)
    print(table(report, "en"), flush=True)
    if args.report:
        launch.write_report(args.report, report)
        for written in [args.report, *render(args.report)]:
            print(f"wrote {written}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
