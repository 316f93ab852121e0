"""Did the distributed run compute what one process would have? Logit drift and cross-rank checks.

Three measurements, each answering its own question:

* **Step drift** (the course's criterion, <= 1e-5), against two single-process references.
  Before each distributed step, the state of the distributed model (parameters and optimizer
  state) is copied into one process, which then takes the same step, and the largest |logit
  difference| on a fixed probe batch after the two steps is measured:

  - against one process on the **whole global batch**: what data parallelism promises. Only the
    order of the additions differs (the matrix products of backward sum over 64 rows at once,
    or over 32 rows twice and then across the ranks), so the weights differ by a few roundings;
  - against one process that **accumulates the same micro-batches** the ranks trained on (each
    rank's slice, in rank order, ``loss / N`` each): what DDP itself controls. On two ranks the
    two computations are the same float operations in the same order (``a + b`` is ``b + a``,
    and halving is exact), so the weights must come out *bit-identical*; from three ranks on,
    the cross-rank sum is associated differently and they differ by a rounding.
* **Trajectory drift** (reported, not a criterion). A single-process run started from the same
  initial weights and never re-synchronised. Training is chaotic: a difference of one rounding
  grows step after step (AdamW and SGD alike), so after a few dozen float32 steps the two runs
  are different, equally good, models. A single process with gradient accumulation diverges
  from one without it in exactly the same way; the lab page shows it.

**The probe is computed exactly.** The logits of both models are computed in float64 from
their float32 weights (every float32 number is exactly a float64 number, see :class:`Probe`).
A float32 forward pass would add its own rounding: two float32 forward passes through weights
that differ in the last bit of a few hundred of 507,552 numbers take different rounding paths
through four blocks, and their logits (about 20 in size, where one float32 step is 1.9e-6)
differ by several such steps, however small the weights' difference. That noise is the
measuring instrument's, not the training's, and it changes with the CPU's kernels. Measured in
float64, the drift is the effect of the weights' difference alone.

And the question DDP must answer exactly: do all ranks hold bit-identical parameters after every
step? They must, since they all apply the same averaged gradient (:func:`ranks_bit_identical`).
"""

from __future__ import annotations

import copy
import hashlib
import math
from collections.abc import Iterable
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from minigpt import grammar
from minigpt.parallel.bounds import FP32_DRIFT_BOUND
from minigpt.train import TrainConfig, build_model, build_optimizer, train_step


def probe_batch(rows: int = 32, block_size: int = 32) -> torch.Tensor:
    """The fixed batch whose logits are compared: the first validation batch."""
    return grammar.get_batch("val", 0, rows, block_size=block_size)[0]


class Probe:
    """The probe batch and an exact ruler for it: the logits a model's weights give, computed in
    float64.

    ``template`` is a model of the same architecture (its own weights are never used): a float64
    copy of it receives the weights of each model measured (``load_state_dict`` copies float32
    into float64 exactly) and runs the probe batch. Pass a plain model, not a wrapped one.
    """

    def __init__(self, template: torch.nn.Module, rows: int = 32, block_size: int = 32):
        self.tokens = probe_batch(rows, block_size)
        self.exact = copy.deepcopy(template).to(torch.float64).eval()

    @torch.no_grad()
    def logits(self, model: torch.nn.Module | dict[str, torch.Tensor]) -> torch.Tensor:
        """The logits on the probe batch, computed in float64 from ``model``'s weights (a model, or
        its full ``state_dict``: what a sharded model gathers)."""
        state = model if isinstance(model, dict) else model.state_dict()
        device = next(iter(state.values())).device
        self.exact.to(device).load_state_dict(state)
        return self.exact(self.tokens.to(device))[0]

    def drift(self, model_a: torch.nn.Module | dict, model_b: torch.nn.Module | dict) -> float:
        """max |logits_a - logits_b| on the probe batch, both computed exactly."""
        return float((self.logits(model_a) - self.logits(model_b)).abs().max())


@torch.no_grad()
def logit_drift(model_a: torch.nn.Module, model_b: torch.nn.Module, probe: torch.Tensor) -> float:
    """max |logits_a - logits_b| on ``probe``, each model's forward pass in its own precision.
    (Lab 01's check uses :class:`Probe` instead, which adds no rounding of its own.)"""
    device = next(model_a.parameters()).device
    return float((model_a(probe.to(device))[0] - model_b(probe.to(device))[0]).abs().max())


def digest(tensors: Iterable[torch.Tensor] | dict[str, torch.Tensor]) -> str:
    """A SHA-256 of the tensors' bytes, in the order given (a dict: in key order, each key with its
    tensor): equal digests mean bit-identical tensors. The one digest of the course's checks."""
    h = hashlib.sha256()
    items = (
        ((k.encode(), v) for k, v in sorted(tensors.items()))
        if isinstance(tensors, dict)
        else ((b"", t) for t in tensors)
    )
    for key, t in items:
        h.update(key)
        h.update(t.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def params_digest(module: torch.nn.Module) -> str:
    """:func:`digest` of every parameter: equal digests mean bit-identical parameters."""
    return digest(module.parameters())


def ranks_bit_identical(module: torch.nn.Module, group: dist.ProcessGroup | None = None) -> bool:
    """True when every rank of ``group`` holds the same parameter bits (a collective call)."""
    digests: list[str | None] = [None] * dist.get_world_size(group)
    dist.all_gather_object(digests, params_digest(module), group=group)
    return len(set(digests)) == 1


def snapshot(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> tuple[dict, dict]:
    """Copies of the parameters and the optimizer state (``optimizer.state_dict()`` shares its
    tensors with the optimizer, so it must be deep-copied)."""
    return ({k: v.detach().clone() for k, v in model.state_dict().items()}, copy.deepcopy(optimizer.state_dict()))


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

    def first_step_above(self, tolerance: float = FP32_DRIFT_BOUND) -> int | None:
        return next((i for i, v in enumerate(self.values) if v > tolerance or math.isnan(v)), None)

    def summary(self) -> dict:
        return {
            "max": self.worst,
            "final": self.final,
            "worst_step": self.worst_step,
            "first_step_above_tolerance": self.first_step_above(),
        }


# ----------------------------------------------------------------------------------------------
# Why the optimizer matters: how much one step turns a gradient difference into a weight difference


def one_step_amplification(
    optimizer: str = "adamw", dtype: str = "float32", at_step: int = 0, lr: float | None = None
) -> dict:
    """From the state reached after ``at_step`` single-process steps, take step ``at_step`` twice:
    on the whole global batch, and as two ranks would (mean of the two half-batch gradients).
    Returns the largest gradient difference, the largest weight difference after the optimizer
    step, and their ratio: how much the optimizer amplifies a rounding difference."""
    from minigpt.train import lr_at

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
    j = int((w1 - w2).abs().argmax())  # the weight that moved apart most: what happened there
    return {
        "optimizer": optimizer,
        "dtype": dtype,
        "at_step": at_step,
        "grad_diff": grad_diff,
        "weight_diff": weight_diff,
        "amplification": weight_diff / grad_diff if grad_diff else float("nan"),
        "lr": lr_at(at_step, cfg.lr, cfg.min_lr, cfg.warmup, cfg.steps),
        "at_largest": {
            "weight": float(w1[j]),
            "ulp": ulp_of(float(w1[j]), w1.dtype),
            "grad_diff": float((g1 - g2)[j].abs()),
            "grad": float(g1[j]),
        },
    }


# ----------------------------------------------------------------------------------------------
# Where a step's drift comes from: which weights ended the step apart, and by how much


def drift_sources(steps: list[int], optimizer: str = "adamw", top: int = 4) -> list[dict]:
    """For each step in ``steps`` of Lab 01's default run on two ranks, find which weights make the
    step drift, in one process.

    Two ranks compute bit for bit what one process computes when it accumulates the two ranks'
    micro-batches (``accum=2``; the check shows it at every step), so this trains such a process
    up to each step, then takes the step twice from the same state: on the whole batch and on the
    two micro-batches. For every parameter tensor it measures the probe's drift when *only that
    tensor* differs (the other tensors taken from the micro-batch step), how many of its numbers
    differ, and its largest difference in float32 steps (units in the last place, ulp) of the
    weight it hit, with the gradient and AdamW's sqrt(v) there. Returns one dict per step, the
    ``top`` tensors that move the logits most first.
    """

    settings = {"adamw": {}, "sgd": {"lr": 0.1, "min_lr": 0.0}}[optimizer]
    configs = {
        "whole": TrainConfig(optimizer=optimizer, **settings),
        "micro": TrainConfig(optimizer=optimizer, accum=2, **settings),
    }
    model = build_model(configs["micro"])
    opt = build_optimizer(model, configs["micro"])
    probe = Probe(model)
    found = []
    for step in range(max(steps) + 1):
        if step in steps:
            start = snapshot(model, opt)
            after = {}
            for kind, cfg in configs.items():
                m = build_model(cfg)
                o = build_optimizer(m, cfg)
                m.load_state_dict(start[0])
                o.load_state_dict(copy.deepcopy(start[1]))
                grads = {}
                o.register_step_pre_hook(
                    lambda *_, m=m, grads=grads: grads.update(
                        {n: q.grad.detach().clone() for n, q in m.named_parameters()}
                    )
                )
                train_step(m, o, step, cfg)
                after[kind] = (m, o, grads)
            found.append(_sources_of_one_step(step, after, probe, top))
        train_step(model, opt, step, configs["micro"])
    return found


def ulp_of(x: float, dtype: torch.dtype = torch.float32) -> float:
    """One unit in the last place of ``x`` in ``dtype``: the gap to the next representable number
    (for float32, 2^-23 of the power of two at or below |x|: 1.19e-7 for weights between 1 and 2)."""
    if x == 0:
        return torch.finfo(dtype).tiny
    _, exponent = math.frexp(abs(x))  # |x| = m * 2^exponent with 0.5 <= m < 1
    return math.ldexp(torch.finfo(dtype).eps, exponent - 1)


def _sources_of_one_step(step: int, after: dict, probe: Probe, top: int) -> dict:
    (whole, _, g_whole), (micro, micro_opt, g_micro) = after["whole"], after["micro"]
    base = probe.logits(micro)
    diff = (probe.logits(whole) - base).abs()
    b, t, v = (int(i) for i in torch.unravel_index(diff.argmax(), diff.shape))
    w_whole, w_micro = whole.state_dict(), micro.state_dict()
    hybrid = copy.deepcopy(micro)
    params = dict(micro.named_parameters())
    rows = []
    for name, param in params.items():
        hybrid.load_state_dict({**w_micro, name: w_whole[name]})
        alone = float((probe.logits(hybrid) - base).abs().max())
        dw = (w_whole[name] - w_micro[name]).abs().flatten()
        j = int(dw.argmax())
        weight = float(w_micro[name].flatten()[j])
        ulp = ulp_of(weight, w_micro[name].dtype)
        exp_avg_sq = micro_opt.state[param].get("exp_avg_sq")
        rows.append(
            {
                "param": name,
                "drift_alone": alone,
                "numbers_differing": int((dw > 0).sum()),
                "numbers": dw.numel(),
                "max_weight_difference": float(dw[j]),
                "weight_there": weight,
                "ulps_there": float(dw[j]) / ulp if dw[j] else 0.0,
                "gradient_there": float(g_micro[name].flatten()[j]),
                "gradient_difference_there": float((g_whole[name] - g_micro[name]).flatten()[j].abs()),
                "sqrt_v_there": float(exp_avg_sq.flatten()[j].sqrt()) if exp_avg_sq is not None else None,
            }
        )
    rows.sort(key=lambda r: -r["drift_alone"])
    differing = sum(r["numbers_differing"] for r in rows)
    return {
        "step": step,
        "drift": float(diff.max()),
        "where": {"row": b, "position": t, "token": v, "logit": float(base[b, t, v])},
        "largest_logit": float(base.abs().max()),
        "numbers_differing": differing,
        "numbers": sum(r["numbers"] for r in rows),
        "params": rows[:top],
    }
