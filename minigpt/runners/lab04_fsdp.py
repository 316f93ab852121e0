"""Lab 04: our own FSDP (:mod:`minigpt.parallel.fsdp_by_hand`) trains MiniGPT, held against one process and FSDP2.

    torchrun --nproc_per_node=2 lab/04_fsdp.py                                 # train, tutor accuracy
    torchrun --nproc_per_node=2 lab/04_fsdp.py --check --report out/lab04.json   # ... and the proofs
    torchrun --nproc_per_node=2 lab/04_fsdp.py --check --impl exercises          # with your exercises
    python lab/04_fsdp.py --render lab/results/04-fsdp-cpu.json                  # the page's tables

Every rank builds MiniGPT from ``--seed``, makes each block a unit and then the root (the block
policy of Lab 03), and trains with AdamW on its slice of each global batch. ``--check`` adds:

* **one process** - before every step the full state (weights and AdamW moments, gathered) is
  loaded into a single-process MiniGPT that takes the same step on the whole batch; the largest
  logit difference on the probe batch after the two steps (Lab 01's float64 probe) is the step
  drift, criterion 1e-5; the same for a float64 run (criterion 1e-12); after every step the
  ranks' gathered weights must be bit-identical;
* **FSDP2** - PyTorch's ``fully_shard`` with the same policy trains in lockstep from the same
  weights; after every step the two sets of weights are compared (with clipping, and without);
* **bytes** - what each rank sends per step, against Lab 02's ZeRO-3 model and FSDP2's bytes;
* **order** - our schedule of all-gathers, computations and reduce-scatters against FSDP2's,
  recorded by Lab 03's tracer, for four prefetch settings;
* **memory** - the peak of parameters and gradients this rank holds during a step;
* **mixed precision**, **checkpoint** (saved on 2 ranks, loaded on 1 and on all), **speed**
  (our step against FSDP2's, interleaved rounds).
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import os
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch
import torch.distributed as dist

from minigpt import cli, grammar, impl
from minigpt.divergence import Watch
from minigpt.fsdp.sharded_state import MIXED_PRECISION
from minigpt.fsdp.trace import FSDPTracer
from minigpt.fsdp.variants import VARIANTS, sharded_optimizer, wrap
from minigpt.parallel import equivalence, fsdp_by_hand as ours, launch
from minigpt.parallel.fsdp_by_hand.gradients import global_grad_norm_one_number
from minigpt.train import TrainConfig, build_model, build_optimizer, train_step
from minigpt.zero import comm

PROG = "lab/04_fsdp.py"
# our prefetch settings and the FSDP2 variant of Lab 03 that matches each
SETTINGS = {
    "implicit": "fsdp2-implicit",
    "forward prefetch 1": "fsdp2-explicit-forward",
    "backward prefetch 2": "fsdp2-explicit-backward",
    "no reshard after forward": "fsdp2-no-reshard",
}
FLOAT64_TOLERANCE = 1e-12


# ----------------------------------------------------------------------------------------------
# Building the two sharded models


CLIP_NORMS = ("per-parameter", "one-number")


def shard_ours(
    model: torch.nn.Module,
    setting: str = "implicit",
    recorder=None,
    mp=None,
    group=None,
    clip_norm: str = "per-parameter",
):
    """Our FSDP on MiniGPT with the block policy and a prefetch ``setting`` of :data:`SETTINGS`;
    ``clip_norm="one-number"`` takes the global norm with one all-reduce of one number."""
    unit_class = impl.load("lab04_fsdp", "FSDPUnit")
    if clip_norm == "one-number":
        unit_class = type(
            "OneNumberNormUnit", (unit_class,), {"global_grad_norm": staticmethod(global_grad_norm_one_number)}
        )
    blocks = list(model.blocks)
    reshard = setting != "no reshard after forward"
    for block in blocks:
        ours.fully_shard(block, group, reshard, mp, recorder, unit_class)
    ours.fully_shard(model, group, True, mp, recorder, unit_class)
    units = [model, *blocks]  # forward order
    if setting == "forward prefetch 1":
        for i, unit in enumerate(units):
            ours.set_modules_to_forward_prefetch(unit, blocks[i : i + 1])
    if setting == "backward prefetch 2":
        for i, unit in enumerate(units):  # backward: the root first, then blocks 3, 2, 1, 0
            before = blocks[: i - 1] if unit is not model else blocks
            ours.set_modules_to_backward_prefetch(unit, before[::-1][:2])
    return model


def optimizer_of(model: torch.nn.Module, cfg: TrainConfig) -> torch.optim.Optimizer:
    """AdamW over the shards, as :func:`minigpt.train.build_optimizer` groups them; it knows how to
    clip by the global norm (``train_step`` asks the optimizer first)."""
    optimizer = build_optimizer(model, cfg)

    def clip(max_norm: float) -> torch.Tensor:
        optimizer.last_norm = ours.clip_grad_norm_(model, max_norm)  # kept for --check
        return optimizer.last_norm

    optimizer.clip_grad_norm_ = clip
    return optimizer


def fsdp2_model(cfg: TrainConfig, ctx: launch.DistContext, variant: str = "fsdp2-implicit", mp=None):
    if mp is not None:
        from torch.distributed.fsdp import fully_shard

        model = build_model(cfg).to(ctx.device)
        for block in model.blocks:
            fully_shard(block, mp_policy=mp)
        fully_shard(model, mp_policy=mp)
        return model, [(f"blocks.{i}", b, b) for i, b in enumerate(model.blocks)]
    return wrap(VARIANTS[variant], build_model(cfg).to(ctx.device), ctx.device)


def fsdp2_optimizer_state(optimizer: torch.optim.Optimizer) -> dict:
    """FSDP2's optimizer state with every DTensor gathered whole (AdamW's moments)."""
    state = optimizer.state_dict()
    full = {
        i: {k: v.full_tensor() if hasattr(v, "full_tensor") else v.clone() for k, v in per.items()}
        for i, per in state["state"].items()
    }
    return {"state": full, "param_groups": state["param_groups"]}


def fsdp2_full(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.full_tensor() if hasattr(v, "full_tensor") else v for k, v in model.state_dict().items()}


def max_difference(a: dict, b: dict) -> float:
    return max(float((a[k].double() - b[k].double()).abs().max()) for k in a if a[k].is_floating_point())


# ----------------------------------------------------------------------------------------------
# What the models predict


def model_bytes(cfg: TrainConfig, world_size: int, param_bytes: int = 4, grad_bytes: int = 4) -> int:
    """Lab 02's ZeRO-3 model of one step's bytes per rank, unit by unit: each parameter padded to
    a multiple of N rows; the root all-gathered once (kept for backward), each block twice; one
    reduce-scatter per unit."""
    model = build_model(cfg)
    in_blocks = {id(p) for b in model.blocks for p in b.parameters()}

    def padded(params) -> int:
        return sum(comm.padded(p.shape[0], world_size) * (p.numel() // p.shape[0]) for p in params)

    sizes = [padded([p for p in model.parameters() if id(p) not in in_blocks])]
    sizes += [padded(list(b.parameters())) for b in model.blocks]
    reshard = [False] + [True] * cfg.n_layer
    collectives = comm.unit_collectives(sizes, 3, world_size, param_bytes, grad_bytes, reshard, pad=False)
    return int(sum(c.bytes_sent for c in collectives))


def memory_model(cfg: TrainConfig, world_size: int, setting: str) -> dict:
    """The peak of parameters and gradients one rank holds during a step (fp32), from the units'
    sizes: the shards (weights, and the gradients reduced so far) plus the whole units alive at
    once. The candidates, largest wins:

    * forward: the root (kept whole) and 1 + forward-prefetch blocks gathered;
    * the k-th block of backward, once its gradients are ready and before it is freed: its
      weights and its full gradients, the blocks prefetched ahead (backward depth, or every
      block not yet run without resharding), the root whole, the gradients of the final norm
      (its backward comes first; the tied matrix's waits for its second use, the embedding),
      and k blocks' shard gradients;
    * the end: the root whole with its full gradients, every block's shard gradients.
    """
    model = build_model(cfg)
    in_blocks = {id(p) for b in model.blocks for p in b.parameters()}
    root = [p for p in model.parameters() if id(p) not in in_blocks]
    block = list(model.blocks[0].parameters())

    def padded(params) -> int:
        return 4 * sum(comm.padded(p.shape[0], world_size) * (p.numel() // p.shape[0]) for p in params)

    def whole(params) -> int:
        return 4 * sum(p.numel() for p in params)

    n = cfg.n_layer
    shards = (padded(root) + n * padded(block)) // world_size
    root_full, block_full, block_shard_grad = whole(root), whole(block), padded(block) // world_size
    final_norm_grads = whole(list(model.ln_f.parameters()))
    forward_depth = 1 if setting == "forward prefetch 1" else 0
    backward_depth = 2 if setting == "backward prefetch 2" else 1
    reshard = setting != "no reshard after forward"
    candidates = {"forward": shards + root_full + (1 + forward_depth if reshard else n) * block_full}
    for k in range(n):
        ahead = min(backward_depth, n - 1 - k) if reshard else n - 1 - k
        candidates[f"backward of block {n - 1 - k}"] = (
            shards + root_full + final_norm_grads + k * block_shard_grad + (2 + ahead) * block_full
        )
    candidates["end"] = shards + n * block_shard_grad + 2 * root_full
    where = max(candidates, key=candidates.__getitem__)
    return {"peak": candidates[where], "where": where, "shards": shards, "root": root_full, "block": block_full}


# ----------------------------------------------------------------------------------------------
# The proofs


class OneProcess:
    """Rank 0's single-process twin: from our full state before a step, the same step on the
    whole batch; the drift is measured on the float64 probe (:class:`equivalence.Probe`)."""

    def __init__(self, cfg: TrainConfig, ctx: launch.DistContext):
        self.cfg, self.ctx = cfg, ctx
        self.model = build_model(cfg).to(ctx.device)
        self.optimizer = build_optimizer(self.model, cfg)
        self.probe = equivalence.Probe(build_model(cfg), block_size=cfg.block_size)

    def drift(self, step: int, before: tuple[dict, dict], after: dict, norm: torch.Tensor | None = None) -> float:
        """The step drift; with ``norm``, the twin clips with that norm instead of its own (the
        rest of the step is its own), which takes the norm's float32 rounding out of the measure."""
        self.model.load_state_dict(before[0])
        self.optimizer = build_optimizer(self.model, self.cfg)
        if before[1]["state"]:
            self.optimizer.load_state_dict(copy.deepcopy(before[1]))
        if norm is not None:
            clip = equivalence.clip_with(norm.detach().cpu())
            self.optimizer.clip_grad_norm_ = lambda max_norm: clip(self.model, max_norm)
        else:  # what train_step does by itself, the norms kept: its own (float32) and the exact one
            self.optimizer.clip_grad_norm_ = self._clip_and_keep_norms
        train_step(self.model, self.optimizer, step, self.cfg)
        return self.probe.drift(self.model, after)

    def _clip_and_keep_norms(self, max_norm: float) -> torch.Tensor:
        grads = [p.grad for p in self.model.parameters() if p.grad is not None]
        self.exact_norm = float(torch.nn.utils.get_total_norm([g.double() for g in grads]))
        self.norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm)
        return self.norm


def train(cfg: TrainConfig, args: argparse.Namespace, ctx: launch.DistContext, check: bool) -> dict:
    """Train our FSDP for ``cfg.steps`` steps; with ``check``, one process and FSDP2 in lockstep."""
    from tqdm import tqdm

    recorder = ours.Recorder()
    model = shard_ours(build_model(cfg).to(ctx.device), recorder=recorder, clip_norm=args.clip_norm)
    optimizer = optimizer_of(model, cfg)
    watch = Watch(model, cfg)
    twin = OneProcess(cfg, ctx) if check and ctx.is_main else None
    fsdp2, fsdp2_opt = (None, None)
    if check and cfg.dtype == "float32":
        fsdp2, _ = fsdp2_model(cfg, ctx)
        fsdp2_opt = sharded_optimizer(fsdp2, cfg)
    drift, bit_identical, vs_fsdp2, losses, seconds = equivalence.DriftLog(), True, [], [], 0.0
    same_norm_drift, fsdp2_drift = equivalence.DriftLog(), equivalence.DriftLog()
    worst_norms: dict | None = None
    bar = tqdm(
        range(cfg.steps),
        desc=f"[rank 0] train (fsdp by hand, {cfg.dtype})",
        disable=args.quiet or not ctx.is_main,
        dynamic_ncols=True,
        file=sys.stdout,
    )
    for step in bar:
        before = (ours.full_state_dict(model), ours.full_optimizer_state_dict(model, optimizer)) if check else None
        recorder.begin()
        t0 = time.perf_counter()
        loss = train_step(model, optimizer, step, cfg, ctx.rank, ctx.world_size)
        seconds += time.perf_counter() - t0
        total = torch.tensor([loss], dtype=torch.float64, device=ctx.device)
        dist.all_reduce(total)
        losses.append(float(total) / ctx.world_size)
        after = ours.full_state_dict(model)
        watch.after_step(step, losses[-1], after.items())
        if check:
            found = [0.0, 0.0, 0.0]
            if twin:
                found[0] = twin.drift(step, before, after)
                if cfg.grad_clip > 0:
                    if found[0] > drift.worst:  # the norms at the worst step so far
                        worst_norms = {
                            "step": step,
                            "ours": float(optimizer.last_norm),
                            "one_process": float(twin.norm),
                            "exact": twin.exact_norm,
                        }
                    found[1] = twin.drift(step, before, after, optimizer.last_norm)
            if fsdp2 is not None:
                fsdp2_before = (fsdp2_full(fsdp2), fsdp2_optimizer_state(fsdp2_opt))
                train_step(fsdp2, fsdp2_opt, step, cfg, ctx.rank, ctx.world_size)
                fsdp2_after = fsdp2_full(fsdp2)
                vs_fsdp2.append(max_difference(after, fsdp2_after))
                if twin:
                    found[2] = twin.drift(step, fsdp2_before, fsdp2_after)
            value = torch.tensor(found, dtype=torch.float64, device=ctx.device)
            dist.all_reduce(value, op=dist.ReduceOp.MAX)
            drift.add(float(value[0]))
            same_norm_drift.add(float(value[1]))
            fsdp2_drift.add(float(value[2]))
            digests = [None] * ctx.world_size
            dist.all_gather_object(digests, state_digest(after))
            bit_identical &= len(set(digests)) == 1
        if ctx.is_main:
            bar.set_postfix({"loss": f"{losses[-1]:.4f}", **({"step drift": f"{drift.final:.1e}"} if check else {})})
    bar.close()
    result = {
        "steps": cfg.steps,
        "dtype": cfg.dtype,
        "final_loss": losses[-1],
        "seconds_per_step": seconds / cfg.steps,
        "step_drift": drift.summary() if check else None,
        "step_drift_same_clip_norm": same_norm_drift.summary() if check and cfg.grad_clip > 0 else None,
        "fsdp2_step_drift": fsdp2_drift.summary() if check and fsdp2 is not None else None,
        "norms_at_worst_step": worst_norms,  # rank 0's: the twin runs there
        "ranks_bit_identical": bit_identical if check else None,
        "clip_norm": args.clip_norm,
        "max_difference_from_fsdp2": max(vs_fsdp2) if vs_fsdp2 else None,
        "first_step_differing_from_fsdp2": next((i for i, d in enumerate(vs_fsdp2) if d > 0), None),
        "last_step": _step_record(recorder.steps[-1]),
    }
    if cfg.dtype == "float32":
        full = build_model(cfg).to(ctx.device)
        full.load_state_dict(ours.full_state_dict(model))
        accuracy = grammar.score(full, "test", max_sentences=args.test_sentences, block_size=cfg.block_size)
        result.update(
            tutor_accuracy=accuracy["accuracy"], tutor_correct=accuracy["correct"], tutor_total=accuracy["total"]
        )
    return result


def state_digest(state: dict) -> str:
    """A SHA-1 of every tensor's bytes, in key order: equal digests mean bit-identical states."""
    h = hashlib.sha1()
    for key in sorted(state):
        h.update(key.encode())
        h.update(state[key].detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def _step_record(step) -> dict:
    return {
        "schedule": step.schedule,
        "collectives": step.collectives,
        "bytes_sent": step.bytes_sent(),
        "bytes_by_kind": {k: step.bytes_sent((k,)) for k in ("all-gather", "reduce-scatter", "all-reduce")},
        "peak_held": step.peak_held,
        "timeline": [[round(t, 6), what, unit, held] for t, what, unit, held in step.timeline],
        "completions": [[round(t, 6), unit] for t, unit in step.completions],
    }


def without_clipping(cfg: TrainConfig, ctx: launch.DistContext, steps: int) -> dict:
    """Ours and FSDP2 without gradient clipping, for each precision recipe: the same arithmetic
    in the same order, so the weights must be bit-identical after every step."""
    cfg = replace(cfg, grad_clip=0.0)
    out = {}
    for name, policy in MIXED_PRECISION.items():
        mp = None if policy is None else ours.MixedPrecision(policy.param_dtype, policy.reduce_dtype)
        model = shard_ours(build_model(cfg).to(ctx.device), mp=mp)
        optimizer = optimizer_of(model, cfg)
        fsdp2, _ = fsdp2_model(cfg, ctx, mp=policy)
        fsdp2_opt = sharded_optimizer(fsdp2, cfg)
        diffs = []
        for step in range(steps):
            train_step(model, optimizer, step, cfg, ctx.rank, ctx.world_size)
            train_step(fsdp2, fsdp2_opt, step, cfg, ctx.rank, ctx.world_size)
            diffs.append(max_difference(ours.full_state_dict(model), fsdp2_full(fsdp2)))
        out[name] = {"max_difference": max(diffs), "bit_identical": max(diffs) == 0.0}
    return {"steps": steps, "recipes": out, "bit_identical": all(r["bit_identical"] for r in out.values())}


def norm_orders(cfg: TrainConfig, ctx: launch.DistContext) -> dict:
    """The gradient norm of the first step three ways: ours (one all-reduce of each parameter's
    squared local norm, then the norm of the whole parameters' norms), FSDP2's
    (``clip_grad_norm_``'s own ``get_total_norm`` on its sharded gradients), and the variant with
    one all-reduce of one number (each rank's norm of its pieces' norms, squared)."""
    model = shard_ours(build_model(cfg).to(ctx.device))
    fsdp2, _ = fsdp2_model(cfg, ctx)
    x, y, mask = (
        t.to(ctx.device)
        for t in grammar.get_batch(
            "train", 0, cfg.batch_size, ctx.rank, ctx.world_size, seed=cfg.seed, block_size=cfg.block_size
        )
    )
    model(x, y, mask)[1].backward()
    fsdp2(x, y, mask)[1].backward()
    mine = ours.find_units(model)[0].global_grad_norm(model)
    one_number = global_grad_norm_one_number(model)
    theirs = torch.nn.utils.get_total_norm([p.grad for p in fsdp2.parameters()]).full_tensor()
    return {
        "ours": float(mine),
        "fsdp2": float(theirs),
        "one_number": float(one_number),
        "ours_equals_fsdp2": bool(mine == theirs),
        "parameters": sum(1 for p in fsdp2.parameters() if p.grad is not None),
    }


def traced_fsdp2_step(model, tracer, optimizer, step: int, cfg: TrainConfig, ctx: launch.DistContext) -> None:
    x, y, mask = (
        t.to(ctx.device)
        for t in grammar.get_batch(
            "train", step, cfg.batch_size, ctx.rank, ctx.world_size, seed=cfg.seed, block_size=cfg.block_size
        )
    )
    with tracer, tracer.step(step):
        _, loss = model(x, y, mask)
        tracer.enter_backward()
        loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def orders(cfg: TrainConfig, ctx: launch.DistContext, steps: int = 2) -> dict:
    """For each prefetch setting: our schedule and FSDP2's (Lab 03's tracer), step by step."""
    out = {}
    for setting, variant in SETTINGS.items():
        recorder = ours.Recorder()
        model = shard_ours(build_model(cfg).to(ctx.device), setting, recorder)
        optimizer = optimizer_of(model, cfg)
        fsdp2, blocks = fsdp2_model(cfg, ctx, variant)
        tracer = FSDPTracer(fsdp2, "fsdp2", blocks)
        fsdp2_opt = sharded_optimizer(fsdp2, cfg)
        for step in range(steps):
            recorder.begin()
            train_step(model, optimizer, step, cfg, ctx.rank, ctx.world_size)
            traced_fsdp2_step(fsdp2, tracer, fsdp2_opt, step, cfg, ctx)
        mine = [[e for e in s.schedule if not e.startswith("free ")] for s in recorder.steps]
        theirs = [record.schedule() for record in tracer.steps]
        out[setting] = {
            "fsdp2_variant": variant,
            "schedule": recorder.steps[-1].schedule,
            "fsdp2_schedule": theirs[-1],
            "matches_fsdp2": mine == theirs,
            "bytes_sent": recorder.steps[-1].bytes_sent(),
            "fsdp2_bytes_sent": {k: v for k, v in tracer.steps[-1].summary()["sent_bytes"].items()},
            "peak_held": recorder.steps[-1].peak_held,
            "memory_model": memory_model(cfg, ctx.world_size, setting),
        }
    return out


def mixed_precision(cfg: TrainConfig, ctx: launch.DistContext, steps: int) -> dict:
    """Each recipe of Lab 03 (:data:`MIXED_PRECISION`), ours and FSDP2 from the same weights:
    how far the weights land from one fp32 process, and from each other."""
    probe = equivalence.Probe(build_model(cfg), block_size=cfg.block_size)
    reference = build_model(cfg).to(ctx.device)
    ref_opt = build_optimizer(reference, cfg)
    for step in range(steps):
        train_step(reference, ref_opt, step, cfg)
    out = {}
    for name, policy in MIXED_PRECISION.items():
        mp = None if policy is None else ours.MixedPrecision(policy.param_dtype, policy.reduce_dtype)
        recorder = ours.Recorder()
        model = shard_ours(build_model(cfg).to(ctx.device), recorder=recorder, mp=mp)
        optimizer = optimizer_of(model, cfg)
        fsdp2, _ = fsdp2_model(cfg, ctx, mp=policy)
        fsdp2_opt = sharded_optimizer(fsdp2, cfg)
        for step in range(steps):
            recorder.begin()
            train_step(model, optimizer, step, cfg, ctx.rank, ctx.world_size)
            train_step(fsdp2, fsdp2_opt, step, cfg, ctx.rank, ctx.world_size)
        mine = ours.full_state_dict(model)
        out[name] = {
            "weight_drift": probe.drift(reference, mine),
            "fsdp2_weight_drift": probe.drift(reference, fsdp2_full(fsdp2)),
            "max_difference_from_fsdp2": max_difference(mine, fsdp2_full(fsdp2)),
            "bytes_sent": recorder.steps[-1].bytes_sent(),
            "bytes_model": model_bytes(
                cfg,
                ctx.world_size,
                4 if policy is None else policy.param_dtype.itemsize,
                4 if policy is None else policy.reduce_dtype.itemsize,
            ),
        }
    return {"steps": steps, "recipes": out}


def checkpoint(cfg: TrainConfig, ctx: launch.DistContext, folder: Path) -> dict:
    """Train 3 steps on 2 ranks, save sharded; load on 1 rank and on every rank: the logits."""
    probe = equivalence.probe_batch(block_size=cfg.block_size).to(ctx.device)
    pair = dist.new_group([0, 1])
    alone = dist.new_group([0])
    out: dict = {"saved_at": 2, "loaded_at": {}}
    path = folder / "lab04-sharded"
    saved_logits = None
    if ctx.rank < 2:
        model = shard_ours(build_model(cfg).to(ctx.device), group=pair)
        optimizer = optimizer_of(model, cfg)
        for step in range(3):
            train_step(model, optimizer, step, cfg, ctx.rank, 2)
        ours.save_sharded(model, path, pair)
        with torch.no_grad():
            saved_logits = model(probe)[0]
    dist.barrier()
    loads = [(1, alone if ctx.rank == 0 else None), (ctx.world_size, None)]
    for world, group in loads:
        if world == 1 and ctx.rank != 0:
            continue
        model = shard_ours(build_model(replace(cfg, seed=cfg.seed + 1)).to(ctx.device), group=group)  # other weights
        ours.load_sharded(model, path, group)
        with torch.no_grad():
            logits = model(probe)[0]
        if ctx.rank == 0:
            out["loaded_at"][str(world)] = float((logits - saved_logits).abs().max())
    dist.barrier()
    return out


def speed(cfg: TrainConfig, ctx: launch.DistContext, rounds: int, steps: int) -> dict:
    """Seconds per step, ours and FSDP2, in interleaved rounds (the order alternates)."""
    model = shard_ours(build_model(cfg).to(ctx.device))
    optimizer = optimizer_of(model, cfg)
    fsdp2, _ = fsdp2_model(cfg, ctx)
    fsdp2_opt = sharded_optimizer(fsdp2, cfg)
    runs = {"ours": (model, optimizer), "fsdp2": (fsdp2, fsdp2_opt)}
    times: dict[str, list[float]] = {"ours": [], "fsdp2": []}
    train_step(model, optimizer, 0, cfg, ctx.rank, ctx.world_size)  # warm up both
    train_step(fsdp2, fsdp2_opt, 0, cfg, ctx.rank, ctx.world_size)
    for r in range(rounds):
        for name in ("ours", "fsdp2") if r % 2 == 0 else ("fsdp2", "ours"):
            m, opt = runs[name]
            dist.barrier()
            t0 = time.perf_counter()
            for s in range(steps):
                train_step(m, opt, 1 + s, cfg, ctx.rank, ctx.world_size)
            dist.barrier()
            times[name].append((time.perf_counter() - t0) / steps)
    median = {k: statistics.median(v) for k, v in times.items()}
    return {
        "rounds": rounds,
        "steps_per_round": steps,
        "seconds_per_step": times,
        "median": median,
        "ratio": median["ours"] / median["fsdp2"],
    }


# ----------------------------------------------------------------------------------------------
# The command line


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = cli.torchrun_parser(PROG, __doc__)
    p.add_argument("--steps", type=cli.POSITIVE_INT, default=TrainConfig().steps, help="training steps")
    p.add_argument("--seed", type=cli.SEED, default=0, help="the weights and the batches")
    p.add_argument("--check", action="store_true", help="the proofs: one process, FSDP2, bytes, order, memory")
    p.add_argument("--float64-steps", type=cli.NON_NEGATIVE_INT, default=20, help="--check: steps of the float64 run")
    p.add_argument(
        "--short-steps",
        type=cli.POSITIVE_INT,
        default=10,
        help="--check: steps of the no-clipping and mixed-precision runs",
    )
    p.add_argument(
        "--clip-norm",
        choices=CLIP_NORMS,
        default="per-parameter",
        help="the global gradient norm: one all-reduce of one number per parameter (FSDP2's arithmetic) "
        "or of one number",
    )
    p.add_argument("--rounds", type=cli.NON_NEGATIVE_INT, default=5, help="--check: speed rounds (0: no timing)")
    p.add_argument(
        "--test-sentences",
        type=cli.POSITIVE_INT,
        default=None,
        help="tutor accuracy on this many test sentences (default: all)",
    )
    p.add_argument(
        "--impl",
        choices=impl.IMPLS,
        default=None,
        help="the reference or your lab/exercises/ (default: $MINIGPT_IMPL or reference)",
    )
    p.add_argument("--timeout", type=cli.SECONDS, default=launch.DEFAULT_TIMEOUT_S, help="collective timeout, seconds")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--report", help="write the measurements as JSON here (default: not written)")
    p.add_argument("--render", metavar="JSON", help="only render a report's tables (English and Spanish)")
    return p.parse_args(argv)


def check_args(args: argparse.Namespace, world_size: int) -> TrainConfig:
    cfg = TrainConfig(steps=args.steps, seed=args.seed)
    cli.divisible_by_world(None, cfg.batch_size, world_size)
    if args.check:
        cli.need_world_size(world_size, 2, "--check compares a sharded run of 2 ranks or more with one process")
    if args.report:
        cli.output_file(args.report, "--report")
    return cfg


def measure(cfg: TrainConfig, args: argparse.Namespace, ctx: launch.DistContext) -> dict:
    t_start = time.perf_counter()
    launch.log(
        ctx,
        f"MiniGPT {build_model(cfg).num_params():,} parameters | our FSDP, block policy, world size "
        f"{ctx.world_size} ({ctx.backend}) | {cfg.steps} steps | implementation: {impl.current()}",
    )
    report: dict = {"world_size": ctx.world_size, "implementation": impl.current()}
    report["training"] = train(cfg, args, ctx, args.check)
    t = report["training"]
    report.update(
        tutor_accuracy=t["tutor_accuracy"],
        bytes_per_rank_per_step=t["last_step"]["bytes_sent"],
        bytes_model=model_bytes(cfg, ctx.world_size),
    )
    if args.check:
        launch.log(ctx, f"training: step drift max {t['step_drift']['max']:.2e}; now float64, FSDP2, orders ...")
        f64 = train(replace(cfg, dtype="float64", steps=max(1, args.float64_steps)), args, ctx, True)
        report["float64"] = {"steps": f64["steps"], "step_drift": f64["step_drift"]}
        report["without_clipping"] = without_clipping(cfg, ctx, args.short_steps)
        report["norms"] = norm_orders(cfg, ctx)
        report["orders"] = orders(cfg, ctx)
        report["mixed_precision"] = mixed_precision(cfg, ctx, args.short_steps)
        with tempfile.TemporaryDirectory() as tmp:
            shared = [tmp if ctx.is_main else None]
            dist.broadcast_object_list(shared)
            report["checkpoint"] = checkpoint(cfg, ctx, Path(shared[0]))
            dist.barrier()
        if args.rounds:
            report["speed"] = speed(cfg, ctx, args.rounds, 10)
        fsdp2_bytes = report["orders"]["implicit"]["fsdp2_bytes_sent"]
        report.update(
            max_step_drift=t["step_drift"]["max"],
            ranks_bit_identical=t["ranks_bit_identical"],
            bytes_fsdp2=fsdp2_bytes["all-gather"] + fsdp2_bytes["reduce-scatter"],
            event_order_matches_fsdp2=all(o["matches_fsdp2"] for o in report["orders"].values()),
            bit_identical_to_fsdp2=t["max_difference_from_fsdp2"] == 0.0,
            memory_matches_model=all(o["peak_held"] == o["memory_model"]["peak"] for o in report["orders"].values()),
        )
        report["passed"] = bool(
            report["max_step_drift"] <= equivalence.TOLERANCE
            and report["float64"]["step_drift"]["max"] <= FLOAT64_TOLERANCE
            and report["ranks_bit_identical"]
            and report["bytes_per_rank_per_step"] == report["bytes_model"] == report["bytes_fsdp2"]
            and report["event_order_matches_fsdp2"]
            and report["memory_matches_model"]
            and report["without_clipping"]["bit_identical"]
            and all(v == 0.0 for v in report["checkpoint"]["loaded_at"].values())
            and (report["bit_identical_to_fsdp2"] or args.clip_norm != "per-parameter")
        )
    report.update(
        torch=torch.__version__,
        backend=ctx.backend,
        device=str(ctx.device),
        date=time.strftime("%Y-%m-%d"),
        seconds=time.perf_counter() - t_start,
    )
    if ctx.is_main:
        summary(report, ctx)
        if args.report:
            launch.write_report(args.report, report)
            launch.log(ctx, f"report written to {args.report}")
    return report


def summary(report: dict, ctx: launch.DistContext) -> None:
    t = report["training"]
    launch.log(
        ctx,
        f"final: step {t['steps']} | loss {t['final_loss']:.4f} | tutor accuracy {100 * t['tutor_accuracy']:.1f}% "
        f"({t['tutor_correct']}/{t['tutor_total']}) | bytes per rank per step {report['bytes_per_rank_per_step']:,} "
        f"(model {report['bytes_model']:,})",
    )
    if "passed" in report:
        launch.log(
            ctx,
            f"check {'PASS' if report['passed'] else 'FAIL'}: step drift {report['max_step_drift']:.2e} (float32, "
            f"<= 1e-5), {report['float64']['step_drift']['max']:.2e} (float64, <= 1e-12) | ranks bit-identical "
            f"{report['ranks_bit_identical']} | bytes ours {report['bytes_per_rank_per_step']:,}, model "
            f"{report['bytes_model']:,}, FSDP2 {report['bytes_fsdp2']:,} | order = FSDP2's in every setting: "
            f"{report['event_order_matches_fsdp2']} | without clipping bit-identical to FSDP2: "
            f"{report['without_clipping']['bit_identical']}",
        )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.render:
        from minigpt.pages import lab04

        try:
            cli.input_json(args.render, "--render", ("training", "world_size"), "lab/results/04-fsdp-cpu.json")
        except ValueError as exc:
            return cli.refuse(PROG, str(exc))
        for path in lab04.render(args.render):
            print(f"wrote {path}")
        return 0
    try:
        _, _, world_size = launch.torchrun_env()
        cfg = check_args(args, world_size)
    except (ValueError, RuntimeError) as exc:
        return cli.refuse(PROG, str(exc))
    if args.impl:
        os.environ[impl.ENV_VAR] = args.impl
    ctx = launch.init(args.timeout)
    report = launch.run(ctx, PROG, lambda: measure(cfg, args, ctx))
    launch.teardown()
    return 0 if report.get("passed", True) else 1


if __name__ == "__main__":
    sys.exit(main())
