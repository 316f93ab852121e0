"""Did the distributed run compute what one process would have? Logit drift and cross-rank checks.

Two different questions, two measurements:

* **Step drift** (the course's criterion, <= 1e-5). Before each distributed step, the state of
  the distributed model (parameters and optimizer state) is copied into a single-process model,
  which then takes the same step on the whole global batch. The largest |logit difference| on a
  fixed probe batch after the two steps measures how far *one step* of data parallelism is from
  one step of a single process: only summation order differs, so it is a few float32 roundings.
* **Trajectory drift** (reported, not a criterion). A single-process run started from the same
  initial weights and never re-synchronised. Training is chaotic: a difference of one rounding
  grows step after step (AdamW and SGD alike), so after a few dozen float32 steps the two runs
  are different, equally good, models. A single process with gradient accumulation diverges
  from one without it in exactly the same way; the lab page shows it.

And the question DDP must answer exactly: do all ranks hold bit-identical parameters after every
step? They must, since they all apply the same averaged gradient (:func:`ranks_bit_identical`).
"""

from __future__ import annotations

import copy
import hashlib
import math
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from minigpt import grammar

TOLERANCE = 1e-5


def probe_batch(rows: int = 32, block_size: int = 32) -> torch.Tensor:
    """The fixed batch whose logits are compared: the first validation batch."""
    return grammar.get_batch("val", 0, rows, block_size=block_size)[0]


@torch.no_grad()
def logit_drift(model_a: torch.nn.Module, model_b: torch.nn.Module, probe: torch.Tensor) -> float:
    """max |logits_a - logits_b| on ``probe``."""
    device = next(model_a.parameters()).device
    return float((model_a(probe.to(device))[0] - model_b(probe.to(device))[0]).abs().max())


def params_digest(module: torch.nn.Module) -> str:
    """A SHA-1 of every parameter's bytes: equal digests mean bit-identical parameters."""
    h = hashlib.sha1()
    for p in module.parameters():
        h.update(p.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def ranks_bit_identical(module: torch.nn.Module, group: dist.ProcessGroup | None = None) -> bool:
    """True when every rank of ``group`` holds the same parameter bits (a collective call)."""
    digests: list[str | None] = [None] * dist.get_world_size(group)
    dist.all_gather_object(digests, params_digest(module), group=group)
    return len(set(digests)) == 1


def snapshot(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> tuple[dict, dict]:
    """Copies of the parameters and the optimizer state (``optimizer.state_dict()`` shares its
    tensors with the optimizer, so it must be deep-copied)."""
    return ({k: v.detach().clone() for k, v in model.state_dict().items()},
            copy.deepcopy(optimizer.state_dict()))


@dataclass
class DriftLog:
    """Drift after every step, and what a report needs from it."""

    values: list[float] = field(default_factory=list)

    def add(self, value: float) -> None:
        self.values.append(value)

    @property
    def worst(self) -> float:
        return max(self.values, default=0.0)

    @property
    def worst_step(self) -> int:
        return max(range(len(self.values)), key=self.values.__getitem__, default=-1)

    @property
    def final(self) -> float:
        return self.values[-1] if self.values else 0.0

    def first_step_above(self, tolerance: float = TOLERANCE) -> int | None:
        return next((i for i, v in enumerate(self.values) if v > tolerance or math.isnan(v)), None)

    def summary(self) -> dict:
        return {"max": self.worst, "final": self.final, "worst_step": self.worst_step,
                "first_step_above_tolerance": self.first_step_above()}


# ----------------------------------------------------------------------------------------------
# Why the optimizer matters: how much one step turns a gradient difference into a weight difference


def one_step_amplification(optimizer: str = "adamw", dtype: str = "float32", at_step: int = 0,
                           lr: float | None = None) -> dict:
    """From the state reached after ``at_step`` single-process steps, take step ``at_step`` twice:
    on the whole global batch, and as two ranks would (mean of the two half-batch gradients).
    Returns the largest gradient difference, the largest weight difference after the optimizer
    step, and their ratio: how much the optimizer amplifies a rounding difference."""
    from minigpt.train import TrainConfig, build_model, build_optimizer, lr_at, train_step

    settings = {"adamw": {}, "sgd": {"lr": 0.1, "min_lr": 0.0}}[optimizer]
    if lr is not None:
        settings["lr"] = lr
    cfg = TrainConfig(optimizer=optimizer, dtype=dtype, grad_clip=0.0, **settings)
    model = build_model(cfg)
    opt = build_optimizer(model, cfg)
    for step in range(at_step):
        train_step(model, opt, step, cfg)
    start = snapshot(model, opt)
    results = []
    for world_size in (1, 2):
        model.load_state_dict(start[0])
        opt.load_state_dict(copy.deepcopy(start[1]))
        for rank in range(world_size):
            x, y, mask = grammar.get_batch("train", at_step, cfg.batch_size, rank, world_size, seed=cfg.seed)
            (model(x, y, mask)[1] / world_size).backward()  # the sum of the two halves = their mean
        grads = torch.cat([p.grad.flatten() for p in model.parameters()])
        for group in opt.param_groups:
            group["lr"] = lr_at(at_step, cfg.lr, cfg.min_lr, cfg.warmup, cfg.steps)
        opt.step()
        opt.zero_grad(set_to_none=True)
        results.append((grads, torch.cat([p.detach().flatten() for p in model.parameters()])))
    (g1, w1), (g2, w2) = results
    grad_diff, weight_diff = float((g1 - g2).abs().max()), float((w1 - w2).abs().max())
    return {"optimizer": optimizer, "dtype": dtype, "at_step": at_step, "grad_diff": grad_diff,
            "weight_diff": weight_diff, "amplification": weight_diff / grad_diff if grad_diff else float("nan")}


AMPLIFICATION_HEADER = {
    "en": "| optimizer | dtype | at step | max gradient difference | max weight difference | ratio |",
    "es": "| optimizador | tipo | en el paso | diferencia máxima de gradiente | diferencia máxima de pesos | cociente |",
}


def amplification_tables(rows: list[dict]) -> dict[str, str]:
    """The measured rows as a Markdown table per language (Spanish uses a decimal comma)."""
    tables = {}
    for lang, header in AMPLIFICATION_HEADER.items():
        lines = [header, "| --- | --- | ---: | ---: | ---: | ---: |"]
        for r in rows:
            cells = [f"{r[k]:.1e}" for k in ("grad_diff", "weight_diff", "amplification")]
            if lang == "es":
                cells = [c.replace(".", ",") for c in cells]
            lines.append(f"| {r['optimizer']} | {r['dtype']} | {r['at_step']} | " + " | ".join(cells) + " |")
        tables[lang] = "\n".join(lines) + "\n"
    return tables


if __name__ == "__main__":
    # python -m minigpt.dist.equivalence [OUTDIR]: measure, print, and write the Lab 01 guide's
    # tables OUTDIR/01-amplification-en.txt and -es.txt (about 90 s on one core)
    import json
    import sys
    from pathlib import Path

    torch.set_num_threads(1)
    rows = [one_step_amplification(optimizer, dtype, at_step)
            for dtype in ("float32", "float64") for optimizer in ("sgd", "adamw") for at_step in (0, 100)]
    tables = amplification_tables(rows)
    print(tables["en"])
    if len(sys.argv) > 1:
        out = Path(sys.argv[1])
        (out / "01-amplification.json").write_text(json.dumps(rows, indent=2) + "\n")
        for lang, text in tables.items():
            (out / f"01-amplification-{lang}.txt").write_text(text)
