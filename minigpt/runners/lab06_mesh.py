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
import json
import os
import sys
import time

import torch
import torch.distributed as dist

from minigpt import cli, grammar, impl
from minigpt.parallel import equivalence, launch
from minigpt.parallel.mesh import BatchPlan, hsdp as mh, resolve_hsdp, torchrun_layout
from minigpt.parallel.ring import ByteCounter, chunk_bounds
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
    from minigpt.runners.lab02_crosscheck import fsdp2_unit_sizes
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


def run_hsdp(cfg: TrainConfig, args: argparse.Namespace, ctx: launch.DistContext, replicate: int, shard: int) -> dict:
    """``cfg.steps`` steps of MiniGPT under FSDP2 on a ``(replicate, shard)`` mesh, every rank on its
    slice of the batch: each step's bytes per mesh dimension, the model states after the optimizer
    step, and (``--check``) the step drift against the single-process twin."""
    from torch.distributed.device_mesh import init_device_mesh

    from minigpt.fsdp.memory import model_state_bytes
    from minigpt.runners.lab02_crosscheck import Run, full, load_reference, reshard

    mesh = init_device_mesh("cpu", (replicate, shard), mesh_dim_names=("replicate", "shard"))
    dims = {"shard": mesh.get_group("shard"), "replicate": mesh.get_group("replicate")}
    model = mh.hsdp_shard(build_model(cfg), mesh)
    optimizer = build_optimizer(model, cfg)
    census: dict = {}
    optimizer.register_step_post_hook(lambda *_: census.update(model_state_bytes(model, optimizer)))
    run = Run("fsdp2", model, model, optimizer)
    probe = equivalence.Probe(build_model(cfg), block_size=cfg.block_size)
    reference = build_model(cfg)  # the single-process twin, given the whole state before each step
    ref_optimizer = build_optimizer(reference, cfg)
    drift, sent, calls, losses = equivalence.DriftLog(), [], {}, []
    for step in range(cfg.steps):
        if args.check:
            load_reference(run, reference, ref_optimizer)
        with mh.MeshCollectiveCounter(dims) as counter:
            losses.append(train_step(model, optimizer, step, cfg, ctx.rank, ctx.world_size))
        sent.append(mh.bytes_sent_per_dim(counter, {"shard": shard, "replicate": replicate}))
        calls = counter.summary()
        if args.check:
            train_step(reference, ref_optimizer, step, cfg)
            weights = {k: full(v.detach()) for k, v in model.state_dict().items()}
            value = torch.tensor([probe.drift(reference, weights)], dtype=torch.float64)
            dist.all_reduce(value, op=dist.ReduceOp.MAX)
            drift.add(float(value))
            reshard(model)
        if ctx.is_main and not args.quiet and (step + 1) % 10 == 0:
            launch.log(ctx, f"HSDP step {step + 1}/{cfg.steps}: loss {losses[-1]:.4f}")
    prediction = hsdp_model(cfg, replicate, shard, mesh.get_local_rank("shard"))
    every_rank = [None] * ctx.world_size
    dist.all_gather_object(every_rank, {"measured": census["total"], "model": prediction["model_states"]})
    return {
        "mesh": {"replicate": replicate, "shard": shard},
        "final_loss": losses[-1],
        "collectives_per_step": calls,
        "bytes_per_dim": sent[-1],
        "bytes_constant_over_steps": all(s == sent[0] for s in sent),
        "prediction": prediction,
        "model_states_after_step": census,
        "model_states_every_rank": every_rank,
        "step_drift": drift.summary() if args.check else None,
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
    """One DP x TP model: its mesh, its groups, the cut model, the DDP around it, the counters."""

    def __init__(self, cfg: TrainConfig, dp: int, tp: int):
        from torch.distributed.device_mesh import init_device_mesh

        from minigpt.parallel.ddp import BucketedDDP
        from minigpt.parallel.tensor_parallel import TPMiniGPT
        from minigpt.parallel.tensor_parallel.kit import kit_for

        self.cfg, self.dp, self.tp = cfg, dp, tp
        self.mesh = init_device_mesh("cpu", (dp, tp), mesh_dim_names=("dp", "tp"))
        self.tp_group, self.dp_group = self.mesh.get_group("tp"), self.mesh.get_group("dp")
        self.dp_rank = self.mesh.get_local_rank("dp")
        self.tp_bytes, self.norm_bytes = ByteCounter(), ByteCounter()
        self.model = TPMiniGPT(build_model(cfg), group=self.tp_group, counter=self.tp_bytes, kit=kit_for())
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


def dp_tp_one_step(cfg: TrainConfig, dp: int, tp: int) -> dict:
    """One forward and backward on the first batch against one process: logits of this DP rank's
    rows and every gradient (averaged over the DP ranks by DDP), gathered."""
    from minigpt.parallel.tensor_parallel import gather_logits

    run = DpTp(cfg, dp, tp)
    one = build_model(cfg)
    x, y, mask = grammar.get_batch("train", 0, cfg.batch_size, seed=cfg.seed, block_size=cfg.block_size)
    logits, loss = one(x, y, mask)
    loss.backward()
    rows = slice(run.dp_rank * cfg.batch_size // dp, (run.dp_rank + 1) * cfg.batch_size // dp)
    local, cut_loss = run.ddp(x[rows], y[rows], mask[rows])
    cut_loss.backward()
    gathered = gather_logits(local, cfg.model_config().vocab_size, run.tp_group)
    grads = run.model.full_state_dict(grads=True)
    return {
        "max_logit_diff": float((gathered - logits[rows].detach()).abs().max()),
        "max_grad_diff": max(float((grads[n] - p.grad).abs().max()) for n, p in one.named_parameters()),
    }


def run_dp_tp(cfg: TrainConfig, args: argparse.Namespace, ctx: launch.DistContext, dp: int, tp: int) -> dict:
    from minigpt.runners.lab05_tensor_parallel import replicated_digest, whole_state

    one_step = dp_tp_one_step(cfg, dp, tp) if args.check else None
    run = DpTp(cfg, dp, tp)
    twin = equivalence.Twin(cfg) if args.check and ctx.is_main else None
    drift, sent, losses, bit_identical = equivalence.DriftLog(), [], [], True
    for step in range(cfg.steps):
        before = whole_state(run.model, run.optimizer) if args.check else None
        run.reset_bytes()
        losses.append(train_step(run.ddp, run.optimizer, step, cfg, run.dp_rank, dp))
        sent.append(run.bytes_per_dim())
        if args.check:
            after = run.model.full_state_dict()
            value = torch.tensor([twin.drift(step, before, after) if twin else 0.0], dtype=torch.float64)
            dist.all_reduce(value, op=dist.ReduceOp.MAX)
            drift.add(float(value))
            digests = [None] * ctx.world_size
            dist.all_gather_object(digests, replicated_digest(run.model))
            # the whole parameters: the same bits on every rank of every tp group (and across dp)
            bit_identical &= len(set(digests)) == 1
        if ctx.is_main and not args.quiet and (step + 1) % 10 == 0:
            launch.log(ctx, f"DP x TP step {step + 1}/{cfg.steps}: loss {losses[-1]:.4f}")
    return {
        "mesh": {"dp": dp, "tp": tp},
        "final_loss": losses[-1],
        "one_step": one_step,
        "bytes_per_dim": sent[-1],
        "bytes_model_per_dim": run.bytes_model_per_dim(),
        "bytes_constant_over_steps": all(s == sent[0] for s in sent),
        "cut_parameter_bytes": run.cut_parameter_bytes(),
        "ddp_buckets": len(run.ddp.buckets),
        "step_drift": drift.summary() if args.check else None,
        "replicated_bit_identical": bit_identical if args.check else None,
    }


# ----------------------------------------------------------------------------------------------
# The command line


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = cli.torchrun_parser(PROG, __doc__, nproc="4")
    p.add_argument("--steps", type=cli.POSITIVE_INT, default=DEFAULT_STEPS, help="training steps of each mesh")
    p.add_argument("--seed", type=cli.SEED, default=0, help="the weights and the batches")
    p.add_argument("--shard", type=cli.POSITIVE_INT, default=None, help="HSDP shard degree (default: LOCAL_WORLD_SIZE)")
    p.add_argument("--replicate", type=cli.POSITIVE_INT, default=None, help="HSDP replicate degree (default: nodes)")
    p.add_argument("--tp", type=cli.POSITIVE_INT, default=2, help="tensor-parallel degree of the DP x TP mesh")
    p.add_argument("--check", action="store_true", help="the proofs: one process, bytes per dimension, memory")
    p.add_argument(
        "--impl",
        choices=impl.IMPLS,
        default=None,
        help="the reference or your lab/exercises/ (default: $MINIGPT_IMPL or reference)",
    )
    p.add_argument("--timeout", type=cli.SECONDS, default=launch.DEFAULT_TIMEOUT_S, help="collective timeout, seconds")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    p.add_argument("--report", help="write the measurements as JSON here (default: not written)")
    p.add_argument("--render", metavar="JSON", help="only render a report's tables (English and Spanish)")
    return p.parse_args(argv)


def check_args(args: argparse.Namespace, world_size: int, local_world_size: int) -> tuple[TrainConfig, dict]:
    """The settings and the degrees, or ValueError naming the value that cannot work and what would."""
    cfg = TrainConfig(steps=args.steps, seed=args.seed)
    if args.check:
        cli.need_world_size(world_size, 2, "--check compares each mesh with one process: it needs 2 ranks or more")
    if args.report:
        cli.output_file(args.report, "--report")
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
        "tolerance": equivalence.TOLERANCE,
    }
    if args.check:
        one = dp_tp["one_step"]
        report["max_step_drift"] = max(hsdp["step_drift"]["max"], dp_tp["step_drift"]["max"])
        report["passed"] = bool(
            report["max_step_drift"] <= equivalence.TOLERANCE
            and one["max_logit_diff"] <= equivalence.TOLERANCE
            and one["max_grad_diff"] <= equivalence.TOLERANCE
            and report["bytes_per_dim"] == report["bytes_model_per_dim"]
            and dp_tp["bytes_per_dim"] == dp_tp["bytes_model_per_dim"]
            and hsdp["bytes_constant_over_steps"]
            and dp_tp["bytes_constant_over_steps"]
            and all(r["measured"] == r["model"] for r in hsdp["model_states_every_rank"])
            and dp_tp["replicated_bit_identical"]
        )
        # every rank's own bytes and memory against its own model: the verdict is every rank's
        verdict = torch.tensor([1.0 if report["passed"] else 0.0])
        dist.all_reduce(verdict, op=dist.ReduceOp.MIN)
        report["passed"] = bool(verdict.item() == 1.0)
    report.update(
        torch=torch.__version__,
        backend=ctx.backend,
        device=str(ctx.device),
        date=time.strftime("%Y-%m-%d"),
        seconds=time.perf_counter() - t_start,
    )
    if ctx.is_main:
        for line in summary(report):
            launch.log(ctx, line)
        if args.report:
            launch.write_report(args.report, report)
            launch.log(ctx, f"report written to {args.report}")
    dist.barrier()  # no rank ends (and has torchrun stop the others) before rank 0 has reported
    return report


def summary(report: dict) -> list[str]:
    """The report's few lines: bytes per dimension and memory against the model, the drift, the verdict."""
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
    if "passed" in report:
        one = d["one_step"]
        lines.append(
            f"check {'PASS' if report['passed'] else 'FAIL'}: step drift HSDP {h['step_drift']['max']:.2e}, DP x TP "
            f"{d['step_drift']['max']:.2e} (<= 1e-5) | DP x TP one step: logits {one['max_logit_diff']:.1e}, "
            f"gradients {one['max_grad_diff']:.1e} | whole parameters bit-identical: {d['replicated_bit_identical']}"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.render:
        try:
            path = cli.input_json(args.render, "--render", ("mesh", "bytes_per_dim"), "out/lab06-mesh.json")
        except ValueError as exc:
            return cli.refuse(PROG, str(exc))
        print("\n".join(summary(json.loads(path.read_text(encoding="utf-8")))))
        from minigpt.pages import lab06

        for written in lab06.render(path):
            print(f"wrote {written}")
        return 0
    if args.impl:
        os.environ[impl.ENV_VAR] = args.impl
    try:
        launch.torchrun_env()
        world_size, local_world_size = torchrun_layout()
        cfg, degrees = check_args(args, world_size, local_world_size)
    except NotImplementedError as exc:
        return cli.stop(PROG, f"{exc} (your code in lab/exercises/ is not written yet)")
    except (ValueError, RuntimeError) as exc:
        return cli.refuse(PROG, str(exc))
    ctx = launch.init(args.timeout)
    report = launch.run(ctx, PROG, lambda: measure(cfg, degrees, args, ctx))
    launch.teardown()
    return 0 if report.get("passed", True) else 1


if __name__ == "__main__":
    sys.exit(main())
