"""Lab 06: two 2-D meshes of four ranks, HSDP and DP x TP, each held against one process.

    torchrun --nproc_per_node=4 lab/06_mesh.py --shard 2 --check --report out/lab06-mesh.json
    # two "nodes" of two ranks on one machine (LOCAL_WORLD_SIZE=2 gives shard 2, replicate 2):
    torchrun --nnodes=2 --nproc_per_node=2 --node_rank=0 --master_addr=127.0.0.1 --master_port=29511 lab/06_mesh.py --check &
    torchrun --nnodes=2 --nproc_per_node=2 --node_rank=1 --master_addr=127.0.0.1 --master_port=29511 lab/06_mesh.py --check

Both parts train MiniGPT with the batch split over the data-parallel ranks and, with ``--check``,
load the whole state into a single-process twin before every step: the twin takes the same step
on the whole batch, and the largest logit difference on the probe batch is the step drift
(Lab 01's criterion, 1e-5).

* **HSDP** - FSDP2's ``fully_shard(..., mesh=mesh)`` on a ``("replicate", "shard")`` mesh
  (degrees from :func:`~minigpt.parallel.mesh.resolve_hsdp`: shard over a node's ranks,
  ``LOCAL_WORLD_SIZE``, unless ``--shard`` / ``--replicate`` say otherwise). Every rank trains on
  its own slice (data parallel over all W ranks). Bytes per dimension counted on FSDP2's calls
  (:class:`~minigpt.parallel.mesh.hsdp.MeshCollectiveCounter`) against Lab 02's unit-by-unit
  model with the replica all-reduce; the model states after the optimizer step against
  :func:`minigpt.zero.memory.hsdp_memory` on the padded parameter count.
* **DP x TP** - a ``("dp", "tp")`` mesh: Lab 05's :class:`~minigpt.parallel.tensor_parallel.TPMiniGPT`
  inside each ``tp`` group, the course's :class:`~minigpt.parallel.ddp.BucketedDDP` on the ring
  across the ``dp`` groups; each DP rank trains on its slice (all TP ranks of it on the same
  slice). The gradient clipping (over the TP group) comes after DDP's averaging. One step's
  logits and gradients against one process; the TP bytes against theory page 02's formula for
  the slice, the DP bytes against the ring's exact count for this rank's buckets.
"""

from __future__ import annotations

import argparse
import logging
import time

import torch
import torch.distributed as dist

from minigpt import cli, grammar, impl
from minigpt.parallel import launch, proof
from minigpt.parallel.mesh import BatchPlan, hsdp as mh, resolve_hsdp, torchrun_layout
from minigpt.parallel.ring import ByteCounter, chunk_bounds
from minigpt.runners import entry
from minigpt.train import TrainConfig, build_model, build_optimizer, train_step

PROG = "lab/06_mesh.py"
EXERCISE_MODULE = "lab06_mesh"
DEFAULT_STEPS = 30
DDP_BUCKET_CAP_MB = 0.5


def exercise(name: str):
    """``resolve_hsdp`` (Exercise 6.3) or ``hsdp_bytes_per_dim`` (Exercise 6.4) of ``MINIGPT_IMPL``:
    the reference's or the learner's."""
    if impl.current() == "reference":
        return {"resolve_hsdp": resolve_hsdp, "hsdp_bytes_per_dim": mh.hsdp_bytes_per_dim}[name]
    return impl.load(EXERCISE_MODULE, name)


# ----------------------------------------------------------------------------------------------
# HSDP: FSDP2 on a ("replicate", "shard") mesh


def hsdp_model(cfg: TrainConfig, replicate: int, shard: int, shard_index: int) -> dict:
    """What the model predicts for one HSDP step and for the model states of shard ``shard_index``
    (fp32 recipe): Lab 02's unit-by-unit collectives with FSDP2's per-parameter padding to a
    multiple of the shard degree, and :func:`~minigpt.zero.memory.hsdp_memory` on the padded
    parameter count, made exact by two terms it leaves out: AdamW's step counters (one float32
    per parameter tensor) and the padding this rank's moments do not hold."""
    from minigpt.fsdp.variants import fsdp2_unit_sizes
    from minigpt.zero import memory

    model = build_model(cfg)
    params = list(model.parameters())
    plain, padded = fsdp2_unit_sizes(model, shard)
    reshard = [False] + [True] * (len(padded) - 1)  # FSDP2 keeps the root gathered for backward
    per_dim = exercise("hsdp_bytes_per_dim")(padded, shard, replicate, 4, 4, reshard)
    states = round(memory.hsdp_memory(sum(padded), shard, replicate, 3, "fp32").device)
    step_counters = 4 * len(params)  # AdamW's float32 "step", one per parameter tensor
    moments_padding = 8 * (sum(padded) // shard - mh.fsdp2_local_elements(params, shard, shard_index))
    return {
        "bytes_per_dim": per_dim,
        "padding_elements": sum(padded) - sum(plain),
        "hsdp_memory": states,
        "adamw_step_counters": step_counters,
        "moments_padding_not_held": moments_padding,
        "model_states": states + step_counters - moments_padding,
    }


class HSDPSystem:
    """FSDP2 on a ``(replicate, shard)`` mesh, every rank on its slice of the batch, as the proof
    harness sees it; each step's bytes per mesh dimension counted on FSDP2's own calls."""

    def __init__(self, cfg: TrainConfig, ctx: launch.DistContext, replicate: int, shard: int):
        from torch.distributed.device_mesh import init_device_mesh

        from minigpt.fsdp.memory import model_state_bytes

        self.cfg, self.ctx, self.replicate, self.shard = cfg, ctx, replicate, shard
        mesh_dims = ("replicate", "shard")
        self.mesh = init_device_mesh(ctx.device.type, (replicate, shard), mesh_dim_names=mesh_dims)
        self.dims = {"shard": self.mesh.get_group("shard"), "replicate": self.mesh.get_group("replicate")}
        self.model = mh.hsdp_shard(build_model(cfg).to(ctx.device), self.mesh)
        self.optimizer = build_optimizer(self.model, cfg)
        self.norm = proof.run_norm_capture(self.model, self.optimizer)
        self.census: dict = {}
        self.optimizer.register_step_post_hook(
            lambda *_: self.census.update(model_state_bytes(self.model, self.optimizer))
        )
        self.sent: list[dict] = []
        self.calls: dict = {}

    def train_step(self, step: int) -> tuple[float, torch.Tensor | None]:
        ctx = self.ctx
        with mh.MeshCollectiveCounter(self.dims) as counter:
            loss = train_step(self.model, self.optimizer, step, self.cfg, ctx.rank, ctx.world_size)
        self.sent.append(mh.bytes_sent_per_dim(counter, {"shard": self.shard, "replicate": self.replicate}))
        self.calls = counter.summary()
        total = torch.tensor([loss], dtype=torch.float64, device=ctx.device)
        dist.all_reduce(total)
        return float(total) / ctx.world_size, self.norm()

    def whole_state(self) -> dict:
        return proof.plain_state(self.model, self.optimizer)

    def first_step(self) -> proof.FirstStep:
        return proof.data_parallel_first_step(self.model, lambda: proof.named_grads(self.model), self.cfg, self.ctx)


def run_hsdp(cfg: TrainConfig, args: argparse.Namespace, ctx: launch.DistContext, replicate: int, shard: int) -> dict:
    """``cfg.steps`` steps of MiniGPT under FSDP2 on a ``(replicate, shard)`` mesh: each step's bytes per
    mesh dimension, the model states after the optimizer step, and (``--check``) the harness's rulers."""
    check = proof.Proof(proof.DATA_PARALLEL, twin_norm="run")
    if args.check:
        check.first_step(lambda c: HSDPSystem(c, ctx, replicate, shard), cfg, ctx)
        check.float64(lambda c: HSDPSystem(c, ctx, replicate, shard), cfg, ctx, args.fp64_steps)
    system = HSDPSystem(cfg, ctx, replicate, shard)

    def on_step(step: int, loss: float, run: proof.DriftRun) -> None:
        if ctx.is_main and not args.quiet and (step + 1) % 10 == 0:
            launch.log(ctx, f"HSDP step {step + 1}/{cfg.steps}: loss {loss:.4f}")

    run = proof.run_with_twin(system, cfg, ctx, twin_norm="run", on_step=on_step, check=args.check)
    if args.check:
        check.float32(run)
    prediction = hsdp_model(cfg, replicate, shard, system.mesh.get_local_rank("shard"))
    every_rank = [None] * ctx.world_size
    dist.all_gather_object(every_rank, {"measured": system.census["total"], "model": prediction["model_states"]})
    return {
        "mesh": {"replicate": replicate, "shard": shard},
        "final_loss": run.losses[-1],
        "collectives_per_step": system.calls,
        "bytes_per_dim": system.sent[-1],
        "bytes_constant_over_steps": all(s == system.sent[0] for s in system.sent),
        "prediction": prediction,
        "model_states_after_step": system.census,
        "model_states_every_rank": every_rank,
        "step_drift": run.summary() if args.check else None,
        "rulers": check.report,
    }


# ----------------------------------------------------------------------------------------------
# DP x TP: Lab 05's TPMiniGPT in each tp group, BucketedDDP across them


def ring_all_reduce_sent(elements: int, element_size: int, n: int, position: int) -> int:
    """Bytes Lab 01's ring all-reduce sends from ring ``position``: every chunk but its own in the
    reduce-scatter, every chunk but its right neighbour's in the all-gather (chunks of
    :func:`~minigpt.parallel.ring.chunk_bounds`, which differ by one element at most)."""
    if n == 1:
        return 0
    sizes = [b - a for a, b in chunk_bounds(elements, n)]
    return (2 * elements - sizes[position] - sizes[(position + 1) % n]) * element_size


class DpTp:
    """One DP x TP model on ``device``: its mesh, its groups, the cut model, the DDP around it, the counters."""

    def __init__(self, cfg: TrainConfig, dp: int, tp: int, device: torch.device | str = "cpu"):
        from torch.distributed.device_mesh import init_device_mesh

        from minigpt.parallel.ddp import BucketedDDP
        from minigpt.parallel.tensor_parallel import TPMiniGPT
        from minigpt.parallel.tensor_parallel.kit import kit_for

        self.cfg, self.dp, self.tp, self.device = cfg, dp, tp, torch.device(device)
        self.mesh = init_device_mesh(self.device.type, (dp, tp), mesh_dim_names=("dp", "tp"))
        self.tp_group, self.dp_group = self.mesh.get_group("tp"), self.mesh.get_group("dp")
        self.dp_rank = self.mesh.get_local_rank("dp")
        self.tp_bytes, self.norm_bytes = ByteCounter(), ByteCounter()
        model = build_model(cfg).to(device)
        self.model = TPMiniGPT(model, group=self.tp_group, counter=self.tp_bytes, kit=kit_for())
        self.ddp = BucketedDDP(
            self.model, bucket_cap_mb=DDP_BUCKET_CAP_MB, collective="ring", process_group=self.dp_group
        )
        self.optimizer = build_optimizer(self.model, cfg)
        # train_step clips with the optimizer's clip_grad_norm_ when it has one: the whole model's
        # norm over the tp group, taken after backward, so after DDP's averaging
        self.optimizer.clip_grad_norm_ = lambda max_norm: self.model.clip_grad_norm_(max_norm, self.norm_bytes)

    def reset_bytes(self) -> None:
        for counter in (self.tp_bytes, self.norm_bytes, self.ddp.ring_bytes):
            counter.reset()

    def bytes_per_dim(self) -> dict[str, int]:
        return {"dp": self.ddp.ring_bytes.sent, "tp": self.tp_bytes.sent + self.norm_bytes.sent}

    def bytes_model_per_dim(self) -> dict[str, int]:
        """Theory page 02's TP bytes for this DP rank's slice of the batch, plus the norm's one
        number; the DP ring's exact bytes for every bucket of this rank's cut parameters."""
        from minigpt.parallel.tensor_parallel.model import ring_all_reduce_bytes, tp_bytes_per_step

        cfg, rows = self.cfg, self.cfg.batch_size // self.dp
        tp = tp_bytes_per_step(rows, cfg.block_size, cfg.n_embd, cfg.n_layer, self.tp) + ring_all_reduce_bytes(
            4, self.tp
        )
        dp = sum(
            ring_all_reduce_sent(b.buffer.numel(), b.buffer.element_size(), self.dp, self.dp_rank)
            for b in self.ddp.buckets
        )
        return {"dp": dp, "tp": round(tp)}

    def cut_parameter_bytes(self) -> int:
        return sum(p.numel() * p.element_size() for p in self.model.parameters())


class DpTpSystem:
    """Our DP x TP (:class:`DpTp`) as the proof harness sees it: each DP rank its slice of the batch."""

    def __init__(self, cfg: TrainConfig, dp: int, tp: int, device: torch.device | str = "cpu"):
        self.cfg, self.run = cfg, DpTp(cfg, dp, tp, device)
        self.sent: list[dict] = []
        run = self.run
        # the whole model's norm over the tp group, after DDP's averaging
        self.norm = proof.clip_capture(
            run.optimizer, lambda max_norm: run.model.clip_grad_norm_(max_norm, run.norm_bytes)
        )

    def train_step(self, step: int) -> tuple[float, torch.Tensor | None]:
        run = self.run
        run.reset_bytes()
        loss = train_step(run.ddp, run.optimizer, step, self.cfg, run.dp_rank, run.dp)
        self.sent.append(run.bytes_per_dim())
        total = torch.tensor([loss], dtype=torch.float64, device=run.device)
        dist.all_reduce(total)  # every tp rank of a dp rank has its slice's loss
        return float(total) / dist.get_world_size(), self.norm()

    def whole_state(self) -> dict:
        from minigpt.parallel.tensor_parallel.model import whole_state

        return whole_state(self.run.model, self.run.optimizer)

    def first_step(self) -> proof.FirstStep:
        from minigpt.parallel.tensor_parallel import gather_logits

        cfg, run = self.cfg, self.run
        batch = grammar.get_batch("train", 0, cfg.batch_size, seed=cfg.seed, block_size=cfg.block_size)
        rows = grammar.rank_slice(cfg.batch_size, run.dp_rank, run.dp)
        local, loss = run.ddp(*(t[rows].to(run.device) for t in batch))
        loss.backward()
        logits = gather_logits(local, cfg.model_config().vocab_size, run.tp_group).detach()
        return proof.FirstStep(rows, logits, run.model.full_state_dict(grads=True))


class TorchDpTpSystem:
    """PyTorch's own DP x TP on the same ``("dp", "tp")`` mesh: ``parallelize_module`` (Lab 05's
    comparison, :mod:`~minigpt.parallel.tensor_parallel.torch_tp`) on the tp sub-mesh, then FSDP2's
    ``fully_shard`` of every block and the root on the dp sub-mesh (PyTorch's way to add data
    parallelism to TP: it shards where our DDP replicates), on ``device``."""

    def __init__(self, cfg: TrainConfig, dp: int, tp: int, device: torch.device | str = "cpu"):
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        from minigpt.parallel.tensor_parallel import torch_tp

        # DTensor warns that a 2-D redistribution takes two collectives: true, and no concern here
        logging.getLogger("torch.distributed.tensor._redistribute").setLevel(logging.ERROR)
        self.cfg, self.dp, self.device = cfg, dp, torch.device(device)
        mesh = init_device_mesh(self.device.type, (dp, tp), mesh_dim_names=("dp", "tp"))
        self.dp_rank = mesh.get_local_rank("dp")
        model = torch_tp.parallelize(torch_tp.split_qkv(build_model(cfg).to(device)), mesh["tp"])
        for block in model.blocks:
            fully_shard(block, mesh=mesh["dp"])
        self.model = fully_shard(model, mesh=mesh["dp"])
        self.optimizer = build_optimizer(self.model, cfg)
        self.norm = proof.clip_capture(self.optimizer, lambda max_norm: torch_tp.clip_grad_norm_(self.model, max_norm))

    def train_step(self, step: int) -> tuple[float, torch.Tensor | None]:
        loss = train_step(self.model, self.optimizer, step, self.cfg, self.dp_rank, self.dp)
        total = torch.tensor([loss], dtype=torch.float64, device=self.device)
        dist.all_reduce(total)
        return float(total) / dist.get_world_size(), self.norm()

    def whole_state(self) -> dict:
        from minigpt.parallel.tensor_parallel import torch_tp

        return torch_tp.whole_state(self.model, self.optimizer)

    def first_step(self) -> proof.FirstStep:
        from minigpt.parallel.tensor_parallel import torch_tp

        cfg = self.cfg
        batch = grammar.get_batch("train", 0, cfg.batch_size, seed=cfg.seed, block_size=cfg.block_size)
        rows = grammar.rank_slice(cfg.batch_size, self.dp_rank, self.dp)
        logits, loss = self.model(*(t[rows].to(self.device) for t in batch))
        loss.backward()
        return proof.FirstStep(rows, proof.whole(logits), torch_tp.whole_gradients(self.model))


def run_dp_tp(cfg: TrainConfig, args: argparse.Namespace, ctx: launch.DistContext, dp: int, tp: int) -> dict:
    """Our DP x TP with the harness's rulers, and PyTorch's DP x TP on the same mesh and run."""
    from minigpt.parallel.tensor_parallel.model import replicated_digest

    check = proof.Proof(proof.MODEL_PARALLEL, twin_norm="run")
    if args.check:
        check.first_step(lambda c: DpTpSystem(c, dp, tp, ctx.device), cfg, ctx)
        check.float64(lambda c: DpTpSystem(c, dp, tp, ctx.device), cfg, ctx, args.fp64_steps)
    system = DpTpSystem(cfg, dp, tp, ctx.device)

    def on_step(step: int, loss: float, run: proof.DriftRun) -> None:
        if ctx.is_main and not args.quiet and (step + 1) % 10 == 0:
            launch.log(ctx, f"DP x TP step {step + 1}/{cfg.steps}: loss {loss:.4f}")

    run = proof.run_with_twin(system, cfg, ctx, twin_norm="run", on_step=on_step, check=args.check)
    out = {
        "mesh": {"dp": dp, "tp": tp},
        "final_loss": run.losses[-1],
        "bytes_per_dim": system.sent[-1],
        "bytes_model_per_dim": system.run.bytes_model_per_dim(),
        "bytes_constant_over_steps": all(s == system.sent[0] for s in system.sent),
        "cut_parameter_bytes": system.run.cut_parameter_bytes(),
        "ddp_buckets": len(system.run.ddp.buckets),
        "step_drift": run.summary() if args.check else None,
    }
    if args.check:
        check.float32(run)
        digests = [None] * ctx.world_size
        dist.all_gather_object(digests, replicated_digest(system.run.model))
        # the whole parameters: the same bits on every rank of every tp group (and across dp)
        out["replicated_bit_identical"] = len(set(digests)) == 1
        theirs_first = TorchDpTpSystem(cfg, dp, tp, ctx.device).first_step()
        ours_first = check.first  # the first step ruler 2 measured
        diff = torch.tensor(
            [float((theirs_first.logits - ours_first.logits).abs().max())], dtype=torch.float64, device=ctx.device
        )
        dist.all_reduce(diff, op=dist.ReduceOp.MAX)
        theirs = proof.run_with_twin(TorchDpTpSystem(cfg, dp, tp, ctx.device), cfg, ctx, twin_norm="run")
        check.report.update(
            pytorch_impl="FSDP2 fully_shard on the dp sub-mesh + parallelize_module on the tp sub-mesh",
            pytorch_first_step_logit_diff=float(diff[0]),
            pytorch_fp32_max_step_drift=theirs.drift.worst,
        )
        out["pytorch_step_drift"] = theirs.summary()
    out["rulers"] = check.report
    return out


# ----------------------------------------------------------------------------------------------
# The command line


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = cli.torchrun_parser(PROG, __doc__, nproc="4")
    p.add_argument("--steps", type=cli.POSITIVE_INT, default=DEFAULT_STEPS, help="training steps of each mesh")
    p.add_argument("--seed", type=cli.SEED, default=0, help="the weights and the batches")
    p.add_argument("--shard", type=cli.POSITIVE_INT, default=None, help="HSDP shard degree (default: LOCAL_WORLD_SIZE)")
    p.add_argument("--replicate", type=cli.POSITIVE_INT, default=None, help="HSDP replicate degree (default: nodes)")
    p.add_argument("--tp", type=cli.POSITIVE_INT, default=2, help="tensor-parallel degree of the DP x TP mesh")
    entry.add_check_flags(p)
    entry.add_run_flags(p)
    cli.add_device_flag(p)
    return p.parse_args(argv)


def check_args(args: argparse.Namespace, world_size: int, local_world_size: int) -> tuple[TrainConfig, dict]:
    """The settings and the degrees, or ValueError naming the value that cannot work and what would."""
    cfg = TrainConfig(steps=args.steps, seed=args.seed)
    if args.check:
        cli.need_world_size(world_size, 2, "--check compares each mesh with one process: it needs 2 ranks or more")
    flags = " ".join(f"--{k} {v}" for k, v in (("replicate", args.replicate), ("shard", args.shard)) if v is not None)
    try:
        replicate, shard = exercise("resolve_hsdp")(world_size, local_world_size, args.shard, args.replicate)
    except ValueError as exc:
        raise ValueError(f"{flags or f'LOCAL_WORLD_SIZE={local_world_size}'}: {exc}") from None
    if world_size % args.tp:
        raise ValueError(
            f"--tp {args.tp} does not divide the world size {world_size}: dp x tp must equal it "
            f"(e.g. --tp 2 under torchrun --nproc_per_node=4)"
        )
    if cfg.n_head % args.tp:
        raise ValueError(f"--tp {args.tp} does not divide MiniGPT's {cfg.n_head} attention heads; use a divisor of it")
    cli.divisible_by_world(None, cfg.batch_size, world_size)
    return cfg, {
        "hsdp": {"replicate": replicate, "shard": shard},
        "dp_tp": {"dp": world_size // args.tp, "tp": args.tp},
    }


def measure(cfg: TrainConfig, degrees: dict, args: argparse.Namespace, ctx: launch.DistContext) -> dict:
    t_start = time.perf_counter()
    h, d = degrees["hsdp"], degrees["dp_tp"]
    launch.log(
        ctx,
        f"MiniGPT {build_model(cfg).num_params():,} parameters | {ctx.world_size} ranks ({ctx.backend}) | HSDP "
        f"replicate {h['replicate']} x shard {h['shard']} | DP {d['dp']} x TP {d['tp']} | {cfg.steps} steps",
    )
    plans = {
        "hsdp": BatchPlan(cfg.batch_size // ctx.world_size, cfg.accum, ctx.world_size, cfg.lr),
        "dp_tp": BatchPlan(cfg.batch_size // d["dp"], cfg.accum, d["dp"], cfg.lr),
    }
    for name, plan in plans.items():
        launch.log(ctx, f"{name}: {plan.describe()} (this run keeps lr {cfg.lr:g}: its twin trains the same batch)")
    hsdp = run_hsdp(cfg, args, ctx, h["replicate"], h["shard"])
    dp_tp = run_dp_tp(cfg, args, ctx, d["dp"], d["tp"])
    report: dict = {
        "world_size": ctx.world_size,
        "mesh": degrees,
        "steps": cfg.steps,
        "batch_plans": {
            k: {"effective_batch": p.effective_batch, "lr_linear": p.lr("linear"), "lr_sqrt": p.lr("sqrt")}
            for k, p in plans.items()
        },
        "bytes_per_dim": hsdp["bytes_per_dim"],
        "bytes_model_per_dim": hsdp["prediction"]["bytes_per_dim"],
        "memory_per_rank": {
            "measured": hsdp["model_states_after_step"]["total"],
            "model": hsdp["prediction"]["model_states"],
            "hsdp_memory": hsdp["prediction"]["hsdp_memory"],
            "every_rank": hsdp["model_states_every_rank"],
        },
        "hsdp": hsdp,
        "dp_tp": dp_tp,
        "full": bool(args.full),
    }
    if args.check:
        h_r, d_r = hsdp["rulers"], dp_tp["rulers"]
        report.update(proof.combined([h_r, d_r], float32=h_r))  # HSDP: the data-parallel family's criterion
        report.update(dp_tp_fp32_max_step_drift=d_r["fp32_max_step_drift"], pytorch_impl=d_r["pytorch_impl"])
        report.update(proof.against_pytorch([d_r]))  # DP x TP: the model-parallel family's
        report.update(
            replicated_bit_identical=dp_tp["replicated_bit_identical"],
            max_step_drift=max(h_r["fp32_max_step_drift"], d_r["fp32_max_step_drift"]),
        )
        v = verdict(report)
        # every rank's own bytes and memory against its own model: the verdict is every rank's
        local = torch.tensor([1.0 if v.criterion_pass else 0.0], device=ctx.device)
        dist.all_reduce(local, op=dist.ReduceOp.MIN)
        v.true("every_rank_agrees", bool(local.item() == 1.0), "each rank's bytes and memory against its own model")
        report.update(v.keys())
    return entry.finish(report, args, ctx, summary, t_start)


def verdict(report: dict) -> proof.Verdict:
    """Lab 06's mesh rulers: the harness's on both meshes, PyTorch's DP x TP, bytes per dimension, memory."""

    h, d = report["hsdp"], report["dp_tp"]
    v = proof.Proof(proof.DATA_PARALLEL, twin_norm="run", report=report).judge()
    v.at_most(
        "dp_tp_fp32_max_step_drift",
        report["dp_tp_fp32_max_step_drift"],
        proof.drift_bound(report["pytorch_fp32_max_step_drift"]),
        f"DP x TP: within 1e-5, or at most 2 x PyTorch's DP x TP ({report['pytorch_fp32_max_step_drift']:.2e})",
    )
    v.at_most(
        "pytorch_first_step_logit_diff",
        report["pytorch_first_step_logit_diff"],
        proof.PYTORCH_ONE_STEP_BOUND,
        "DP x TP: our logits against FSDP2 + parallelize_module's",
    )
    v.equal("bytes_per_dim", report["bytes_per_dim"], report["bytes_model_per_dim"], "HSDP, Lab 02's unit model")
    v.equal("dp_tp.bytes_per_dim", d["bytes_per_dim"], d["bytes_model_per_dim"], "DP x TP")
    v.true("bytes_constant_over_steps", h["bytes_constant_over_steps"] and d["bytes_constant_over_steps"], "both")
    v.true(
        "memory_per_rank",
        all(r["measured"] == r["model"] for r in h["model_states_every_rank"]),
        "HSDP model states, every rank",
    )
    v.true("replicated_bit_identical", report["replicated_bit_identical"], "DP x TP's whole parameters")
    return v


def summary(report: dict) -> list[str]:
    """The report's few lines: bytes per dimension and memory against the model, then the rulers."""
    h, d = report["hsdp"], report["dp_tp"]
    lines = [
        f"HSDP {report['mesh']['hsdp']}: bytes per step shard {report['bytes_per_dim']['shard']:,} "
        f"(model {report['bytes_model_per_dim']['shard']:,}), replicate {report['bytes_per_dim']['replicate']:,} "
        f"(model {report['bytes_model_per_dim']['replicate']:,}) | model states per rank "
        f"{report['memory_per_rank']['measured']:,} B (model {report['memory_per_rank']['model']:,}: hsdp_memory "
        f"{h['prediction']['hsdp_memory']:,} + {h['prediction']['adamw_step_counters']} B of AdamW step counters - "
        f"{h['prediction']['moments_padding_not_held']} B of padding its moments do not hold; every rank: "
        f"{[r['measured'] for r in report['memory_per_rank']['every_rank']]})",
        f"DP x TP {report['mesh']['dp_tp']}: bytes per step tp {d['bytes_per_dim']['tp']:,} (model "
        f"{d['bytes_model_per_dim']['tp']:,}), dp {d['bytes_per_dim']['dp']:,} (model {d['bytes_model_per_dim']['dp']:,})",
    ]
    if report.get("rulers"):
        lines += proof.Verdict.of(report).lines()
    return lines


def check_settings(args: argparse.Namespace, world_size: int) -> tuple[TrainConfig, dict]:
    _, local_world_size = torchrun_layout()
    return check_args(args, world_size, local_world_size)


LAB = entry.Lab(
    PROG,
    parse_args,
    check_settings,
    lambda settings, args, ctx: measure(*settings, args, ctx),
    "minigpt.pages.lab06:render",
    ("mesh", "bytes_per_dim"),
    "out/lab06-mesh.json",
    summary=summary,
)


def main(argv: list[str] | None = None) -> int:
    return entry.main(LAB, argv)
