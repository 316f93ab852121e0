"""Lab 00's batch-scaling run: MiniGPT trained on the same 28,800 sentences at the default batch of 64
(450 steps) and at a batch of 256 (112 steps), with the learning rate kept, scaled by the square root
of the batch's growth and scaled linearly (:func:`minigpt.zero.analytic.scaled_lr`), one process each.

    python lab/00_batch_scaling.py --report lab/results/00-batch-scaling-cpu.json
    python lab/00_batch_scaling.py --render lab/results/00-batch-scaling-cpu.json

Theory page 02 puts the measured table beside the rules; :mod:`minigpt.pages.lab00_scaling` draws it.
Four trainings take a few minutes, so no check runs it.
"""

from __future__ import annotations

import time
from dataclasses import replace

from minigpt.runners import entry

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
    from minigpt.pages.lab00_scaling import table

    def measure() -> dict:
        runs = []
        for run in plan():
            runs.append(train_one(run))
            print(f"batch {run['batch']}, lr {run['lr']:.2e}: accuracy {runs[-1]['accuracy']:.1%}", flush=True)
        return {"runs": runs}

    example = "lab/results/00-batch-scaling-cpu.json"
    return entry.one_process(PROG, __doc__.splitlines()[0], argv, table, RESULT_KEYS, example, measure)
