"""Lab 07: every dimension at once - HSDP, FSDP, context and tensor parallelism on one N-D mesh.

    torchrun --nproc_per_node=8 lab/07_nd_parallel.py --check --report out/lab07.json
    torchrun --nproc_per_node=8 lab/07_nd_parallel.py --dp-replicate 1 --dp-shard 2 --cp 2 --tp 2 --check
    torchrun --nproc_per_node=8 lab/07_nd_parallel.py --check --pp 2      # pp 2 x dp 2 x tp 2
    # two "nodes" of four ranks on one machine:
    torchrun --nnodes=2 --nproc_per_node=4 --node_rank=0 --master_addr=127.0.0.1 --master_port=29517 lab/07_nd_parallel.py --check &
    torchrun --nnodes=2 --nproc_per_node=4 --node_rank=1 --master_addr=127.0.0.1 --master_port=29517 lab/07_nd_parallel.py --check

The mesh is ``dp_replicate x dp_shard x cp x tp`` (:class:`~minigpt.parallel.mesh.nd.NDMesh`,
Accelerate's order, tp innermost). Without degree flags, ``--check`` runs the lab's two layouts
one after the other in one launch: HSDP x TP (2 x 2 x 1 x 2) and FSDP x CP x TP (1 x 2 x 2 x 2).
Each is Lab 05's tensor parallelism (with its ring attention across the cp group) inside Lab 04's
``fully_shard`` over the flattened ``dp_shard x cp`` group, with the replicas averaging the
gradient shards (:mod:`minigpt.parallel.mesh.compose`), held against one process with the proof
harness's rulers, its bytes per dimension against the model of each dimension. ``--pp N`` runs
a pipeline mesh instead, ``pp x dp_replicate x tp``: Lab 06's stages with Lab 05's blocks inside
(:mod:`minigpt.parallel.mesh.pp`), held to the same rulers and to its own byte model.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace

import torch
import torch.distributed as dist

from minigpt import cli, grammar, impl
from minigpt.parallel import equivalence, launch, proof
from minigpt.parallel.fsdp_by_hand.record import Recorder
from minigpt.parallel.mesh import compose, pp, torchrun_layout
from minigpt.parallel.mesh.nd import DIMS, NDMesh, check_degrees
from minigpt.parallel.mesh.nd_model import bytes_model_per_dim, model_states_model
from minigpt.parallel.ring import ByteCounter
from minigpt.runners import entry
from minigpt.train import TrainConfig, build_model, build_optimizer, train_step

PROG = "lab/07_nd_parallel.py"
DEFAULT_STEPS = 20  # the harness's float64 ruler checks at least 20 steps (proof.FP64_MIN_STEPS)
LAYOUTS = {  # the lab's two layouts, when no degree is given
    "hsdp_tp": {"dp_replicate": 2, "dp_shard": 2, "cp": 1, "tp": 2},
    "fsdp_cp_tp": {"dp_replicate": 1, "dp_shard": 2, "cp": 2, "tp": 2},
}


def name_of(mesh: NDMesh | pp.PPMesh) -> str:
    if isinstance(mesh, pp.PPMesh):
        return mesh.describe().split(" = ")[0]
    return " x ".join(str(s) for s in mesh.shape)


# ----------------------------------------------------------------------------------------------
# The composed model


def batch_plan(mesh: NDMesh, rank: int, cfg: TrainConfig) -> tuple[range, torch.Tensor | None]:
    """This rank's rows of the global batch and the positions of its tokens (None: the whole row),
    from Exercise 7.2's ``batch_plan`` (the reference's or the learner's), refused with ValueError
    unless the rows are one of ``dp`` equal consecutive slices and the chunks two different ones of
    ``2 x cp``. (Whether they are the *right* ones, the proof's rulers say: another rank's rows or
    tokens move the first step's logits and every step's drift.)"""
    rows, chunks = impl.load("lab07_nd_parallel", "batch_plan")(mesh.degrees(), rank, cfg.batch_size, cfg.block_size)
    per = cfg.batch_size // mesh.dp
    if (
        not isinstance(rows, range)
        or rows.step != 1
        or len(rows) != per
        or rows.start % per
        or not 0 <= rows.start < cfg.batch_size
    ):
        raise ValueError(
            f"batch_plan(..., rank {rank}, batch {cfg.batch_size}, ...) returned rows {rows!r}: expected a range of "
            f"{per} consecutive rows starting at a multiple of {per} (Exercise 7.2)"
        )
    parts = 2 * mesh.cp
    if len(tuple(chunks)) != 2 or len(set(chunks)) != 2 or not all(c in range(parts) for c in chunks):
        raise ValueError(
            f"batch_plan(..., rank {rank}, ..., seq {cfg.block_size}) returned chunks {chunks!r}: expected two "
            f"different chunk indices in 0..{parts - 1} (Exercise 7.2)"
        )
    if mesh.cp == 1:
        return rows, None
    size = cfg.block_size // parts
    return rows, torch.cat([torch.arange(c * size, (c + 1) * size) for c in chunks])


class NDSystem:
    """MiniGPT on one N-D mesh, as the proof harness sees it (every rank of the world), on ``device``."""

    def __init__(
        self, cfg: TrainConfig, mesh: NDMesh, groups: dict, cp_factor: bool = True, device: torch.device | str = "cpu"
    ):
        from minigpt.parallel import fsdp_by_hand as fsdp
        from minigpt.parallel.tensor_parallel import TPMiniGPT
        from minigpt.parallel.tensor_parallel.kit import kit_for

        self.cfg, self.mesh, self.groups, self.device = cfg, mesh, groups, torch.device(device)
        self.rank = dist.get_rank()
        self.coords = mesh.coords(self.rank)
        self.rows, self.tokens = batch_plan(mesh, self.rank, cfg)
        self.dp_index = self.rows.start // (self.rows.stop - self.rows.start)
        self.counters = {d: ByteCounter() for d in ("tp", "cp", "dp_replicate", "tp_norm")}
        self.recorder = Recorder()
        tp = TPMiniGPT(
            build_model(cfg).to(device),
            group=groups["tp"],
            counter=self.counters["tp"],
            kit=kit_for(),
            cp_group=groups["cp"] if mesh.cp > 1 else None,
            cp_counter=self.counters["cp"],
        )
        cut = tp.sharded_parameters()  # kept alive: their ids name the TP slices below
        cut_ids = {id(p) for p in cut}
        self.unit_shapes = self._unit_shapes(tp)
        unit_class = compose.with_replicas(
            impl.load("lab04_fsdp", "FSDPUnit"), groups["dp_replicate"], self.counters["dp_replicate"]
        )
        originals = dict(tp.named_parameters())  # alive until the units are built: their ids name them
        for block in tp.blocks:
            fsdp.fully_shard(block, groups["dp_shard_cp"], recorder=self.recorder, unit_class=unit_class)
        fsdp.fully_shard(tp, groups["dp_shard_cp"], recorder=self.recorder, unit_class=unit_class)
        name_of_id = {id(p): n for n, p in originals.items()}
        # each TP-local parameter's FSDP piece on this rank, by name (Exercise 7.3 joins them)
        self.pieces = {name_of_id[sp.origin]: sp for u in fsdp.find_units(tp) for sp in u.params}
        del originals, name_of_id
        self.tp_cut = {id(sp.shard) for u in fsdp.find_units(tp) for sp in u.params if sp.origin in cut_ids}
        del cut
        self.model = tp
        # the CP shares summed, not averaged (compose.ShareTimesCP); --drop-cp-factor shows what it is for
        self.root = compose.ShareTimesCP(tp, mesh.cp if cp_factor else 1)
        self.optimizer = build_optimizer(tp, cfg)
        self.norm = proof.clip_capture(
            self.optimizer,
            lambda max_norm: compose.clip_grad_norm_(tp, max_norm, self.tp_cut, groups["tp"], self.counters["tp_norm"]),
        )
        self.sent: list[dict] = []
        self.census: dict = {}
        self.optimizer.register_step_post_hook(lambda *_: self.census.update(self._census()))

    def _census(self) -> dict:
        from minigpt.fsdp.memory import model_state_bytes

        return model_state_bytes(self.model, self.optimizer)

    @staticmethod
    def _unit_shapes(tp) -> list[int]:
        """The TP-local parameter counts of the units: the root (what no block holds), then each block."""
        in_blocks = {id(p) for b in tp.blocks for p in b.parameters()}
        root = [p for p in tp.parameters() if id(p) not in in_blocks]
        return [[tuple(p.shape) for p in root]] + [[tuple(p.shape) for p in b.parameters()] for b in tp.blocks]

    def reset(self) -> None:
        for c in self.counters.values():
            c.reset()
        self.recorder.begin()

    def bytes_per_dim(self) -> dict[str, int]:
        """What this rank sent in the last step, along each dimension."""
        step = self.recorder.current
        shard = step.bytes_sent(("all-gather", "reduce-scatter", "all-reduce"))
        return {
            "tp": self.counters["tp"].sent + self.counters["tp_norm"].sent,
            "cp": self.counters["cp"].sent,
            "dp_shard_cp": shard,
            "dp_replicate": self.counters["dp_replicate"].sent,
        }

    def train_step(self, step: int) -> tuple[float, torch.Tensor | None]:
        self.reset()
        loss = train_step(self.root, self.optimizer, step, self.cfg, self.dp_index, self.mesh.dp)
        self.sent.append(self.bytes_per_dim())
        total = torch.tensor([loss], dtype=torch.float64, device=self.device)
        dist.all_reduce(total)  # loss share x cp on every rank: the sum is world x the batch's loss
        return float(total) / self.mesh.world_size, self.norm()

    def _whole(self, local: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """TP-local whole tensors by TPMiniGPT's names -> MiniGPT's whole tensors (over the tp group)."""
        names = {id(p): n for n, p in self.model.named_parameters()}
        return self.model.full_state_dict(of=lambda p: local[names[id(p)]])

    def tp_local_state(self) -> dict:
        from minigpt.parallel import fsdp_by_hand as fsdp

        return fsdp.whole_training_state(self.model, self.optimizer)

    def whole_state(self) -> dict:
        local = self.tp_local_state()
        return {
            "weights": self._whole(local["weights"]),
            "moments": {k: self._whole(v) for k, v in local["moments"].items()},
            "step": local["step"],
        }

    def first_step(self) -> proof.FirstStep:
        from minigpt.parallel import fsdp_by_hand as fsdp
        from minigpt.parallel.tensor_parallel import gather_logits

        cfg = self.cfg
        batch = grammar.get_batch("train", 0, cfg.batch_size, seed=cfg.seed, block_size=cfg.block_size)
        rows = slice(self.rows.start, self.rows.stop)
        local, loss = self.root(*(t[rows].to(self.device) for t in batch))
        loss.backward()
        logits = gather_logits(local, cfg.model_config().vocab_size, self.groups["tp"]).detach()
        return proof.FirstStep(rows, logits, self._whole(fsdp.full_gradients(self.model)), self.tokens)

    def whole_from_pieces(self) -> dict[str, torch.Tensor]:
        """Every sharded parameter whole, on every rank, from the FSDP pieces of every rank's TP slice
        (one ``all_gather_object``, not counted), joined by Exercise 7.3's ``whole_parameter`` (the
        reference's or the learner's): what saving a checkpoint of this run must do. The replicas hold
        the same pieces: those of replica 0 are used. The pieces travel, and are joined, on the CPU (a
        pickled GPU tensor would come back on the GPU of the rank that sent it)."""
        join = impl.load("lab07_nd_parallel", "whole_parameter")
        shard_rank = dist.get_group_rank(self.groups["dp_shard_cp"], self.rank)
        mine = {n: (sp.shard.detach().to("cpu", copy=True), sp.rows) for n, sp in self.pieces.items()}
        everyone: list = [None] * dist.get_world_size()
        dist.all_gather_object(everyone, (self.coords, shard_rank, mine))
        S = self.mesh.dp_shard * self.mesh.cp
        out = {}
        for name, (tp_dim, parts) in self.model.tp_layout().items():
            if name not in mine:
                continue
            pieces: list[list] = [[None] * S for _ in range(self.mesh.tp)]
            for coords, s, theirs in everyone:
                if coords["dp_replicate"] == 0:
                    pieces[coords["tp"]][s] = theirs[name][0]
            out[name] = join(pieces, mine[name][1], tp_dim, parts)
        if "wte.weight" in out:  # Lab 05 pads the vocabulary to a multiple of tp: not part of MiniGPT
            out["wte.weight"] = out["wte.weight"][: self.cfg.model_config().vocab_size]
        return out

    def digests(self) -> dict[str, str]:
        """Digests of what must be the same bits: the TP-local whole parameters (every rank of the
        same tp coordinate) and the TP-whole ones (every rank)."""
        local = self.tp_local_state()["weights"]
        cut_names = {n for n, p in self.model.named_parameters() if id(p) in self.tp_cut}
        return {
            which: equivalence.digest(local[n] for n in sorted(local) if (n in cut_names) == keep)
            for which, keep in (("tp_slice", True), ("whole", False))
        }


class TorchNDSystem:
    """PyTorch's own composition on the same ranks: ``init_device_mesh`` with the four named
    dimensions, ``parallelize_module`` on the ``tp`` sub-mesh (Lab 05's comparison,
    :mod:`~minigpt.parallel.tensor_parallel.torch_tp`), FSDP2's ``fully_shard`` of every block and the
    root on the 2-D ``("dp_replicate", "dp_shard")`` sub-mesh (HSDP). PyTorch's context parallelism
    does not run on CPU (its ring attention shards a flash-attention kernel that has no CPU
    sharding strategy: ``NotImplementedError``), so with ``cp > 1`` the mesh is
    ``(dp_replicate, dp_shard x cp, tp)``: the cp ranks are more data-parallel ranks, each with its
    own rows of the same global batch, which is the same step. The mesh is of ``device``'s type."""

    def __init__(self, cfg: TrainConfig, mesh: NDMesh, device: torch.device | str = "cpu"):
        import logging

        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        from minigpt.parallel.tensor_parallel import torch_tp

        # DTensor warns that a redistribution over several dimensions takes several collectives
        logging.getLogger("torch.distributed.tensor._redistribute").setLevel(logging.ERROR)
        self.cfg, self.mesh, self.device = cfg, mesh, torch.device(device)
        kind = self.device.type
        if mesh.cp == 1:  # the four named dimensions; HSDP on the (dp_replicate, dp_shard) sub-mesh
            dm = init_device_mesh(kind, mesh.shape, mesh_dim_names=DIMS)
            data = dm["dp_replicate", "dp_shard"]
        else:  # no CP on CPU: its ranks are more shard ranks, dp_shard and cp one dimension
            shape = (mesh.dp_replicate, mesh.dp_shard * mesh.cp, mesh.tp)
            dm = init_device_mesh(kind, shape, mesh_dim_names=("dp_replicate", "dp_shard_cp", "tp"))
            data = dm["dp_replicate", "dp_shard_cp"]
        self.tp_rank = dm.get_local_rank("tp")
        self.dp = data.size()
        self.dp_index = data.get_local_rank(0) * data.size(1) + data.get_local_rank(1)
        model = torch_tp.parallelize(torch_tp.split_qkv(build_model(cfg).to(device)), dm["tp"])
        for block in model.blocks:
            fully_shard(block, mesh=data)
        self.model = fully_shard(model, mesh=data)
        self.optimizer = build_optimizer(self.model, cfg)
        self.norm = proof.clip_capture(self.optimizer, lambda max_norm: torch_tp.clip_grad_norm_(self.model, max_norm))

    def train_step(self, step: int) -> tuple[float, torch.Tensor | None]:
        loss = train_step(self.model, self.optimizer, step, self.cfg, self.dp_index, self.dp)
        total = torch.tensor([loss], dtype=torch.float64, device=self.device)
        dist.all_reduce(total)  # every tp rank of a data-parallel rank has its rows' loss
        return float(total) / self.mesh.world_size, self.norm()

    def whole_state(self) -> dict:
        from minigpt.parallel.tensor_parallel import torch_tp

        return torch_tp.whole_state(self.model, self.optimizer)

    def first_step(self) -> proof.FirstStep:
        from minigpt.parallel.tensor_parallel import torch_tp

        cfg = self.cfg
        batch = grammar.get_batch("train", 0, cfg.batch_size, seed=cfg.seed, block_size=cfg.block_size)
        rows = grammar.rank_slice(cfg.batch_size, self.dp_index, self.dp)
        logits, loss = self.model(*(t[rows].to(self.device) for t in batch))
        loss.backward()
        return proof.FirstStep(rows, proof.whole(logits), torch_tp.whole_gradients(self.model))


def batch_logits(first: proof.FirstStep, mine: bool, cfg: TrainConfig) -> torch.Tensor:
    """The whole batch's logits ``(B, T, V)`` on every rank, from each rank's rows and tokens: the
    ranks with ``mine`` (one of each tensor-parallel group) put theirs in, one all-reduce adds them
    (on the logits' device)."""
    device = first.logits.device
    out = torch.zeros(cfg.batch_size, cfg.block_size, cfg.model_config().vocab_size, dtype=torch.float64, device=device)
    if mine:
        tokens = torch.arange(cfg.block_size) if first.tokens is None else first.tokens
        out[first.rows, tokens.to(device)] = first.logits.detach().to(torch.float64)
    dist.all_reduce(out)
    return out


# ----------------------------------------------------------------------------------------------
# One layout, proved


def against_pytorch(cfg: TrainConfig, mesh: NDMesh, our_first: proof.FirstStep, ctx: launch.DistContext) -> dict:
    """PyTorch's composition on the same mesh: the first step's logits of the whole batch and every
    whole gradient against ours (``our_first``, the one the harness's ruler 2 measured), and its own
    float32 step drift over the same run."""

    f32 = replace(cfg, dtype="float32")
    mine = batch_logits(our_first, mesh.coords(ctx.rank)["tp"] == 0, f32)
    torch_first = TorchNDSystem(f32, mesh, ctx.device)
    their_first = torch_first.first_step()
    theirs = batch_logits(their_first, torch_first.tp_rank == 0, f32)
    # the tied output matrix is wte.weight, under one of its two names in one composition, both in the other
    names = set(our_first.grads) & set(their_first.grads)
    if (set(our_first.grads) | set(their_first.grads)) - names - {"lm_head.weight"}:
        raise RuntimeError(f"the compositions name other gradients: {set(our_first.grads) ^ set(their_first.grads)}")
    grad_diff = max(
        float((our_first.grads[n].double().cpu() - their_first.grads[n].double().cpu()).abs().max()) for n in names
    )
    run = proof.run_with_twin(TorchNDSystem(cfg, mesh, ctx.device), cfg, ctx, twin_norm="run")
    return {
        "pytorch_impl": "init_device_mesh + parallelize_module on tp + fully_shard (HSDP) on "
        "(dp_replicate, dp_shard)"
        + (
            "; PyTorch's context parallelism does not run on CPU: its cp ranks are data parallel" if mesh.cp > 1 else ""
        ),
        "pytorch_first_step_logit_diff": float((mine - theirs).abs().max()),
        "pytorch_first_step_grad_diff": grad_diff,
        "pytorch_fp32_max_step_drift": run.drift.worst,
        "pytorch_one_step_bound": proof.PYTORCH_ONE_STEP_BOUND,
        "pytorch_drift_bound": proof.drift_bound(run.drift.worst),
    }


def prove(build, cfg: TrainConfig, name: str, args: argparse.Namespace, ctx: launch.DistContext):
    """One layout's system trained against its twin, with the harness's rulers under ``--check``:
    ``(system, run, proof)``."""
    check = proof.Proof(proof.MODEL_PARALLEL, twin_norm="run")
    if args.check:
        check.first_step(build, cfg, ctx)
        check.float64(build, cfg, ctx, args.fp64_steps)
    system = build(cfg)

    def on_step(step: int, loss: float, run: proof.DriftRun) -> None:
        if ctx.is_main and not args.quiet:
            launch.log(ctx, f"{name} step {step + 1}/{cfg.steps}: loss {loss:.4f}")

    run = proof.run_with_twin(system, cfg, ctx, twin_norm="run", on_step=on_step, check=args.check)
    if args.check:
        check.float32(run)
    return system, run, check


def run_layout(cfg: TrainConfig, mesh: NDMesh, args: argparse.Namespace, ctx: launch.DistContext) -> dict:
    groups = compose.build_groups(mesh, ctx.rank)
    build = lambda c: NDSystem(c, mesh, groups, not args.drop_cp_factor, ctx.device)  # noqa: E731
    system, run, check = prove(build, cfg, name_of(mesh), args, ctx)
    theirs = {}
    if args.check:
        theirs = against_pytorch(cfg, mesh, check.first, ctx)
        check.report.update(theirs)
    digests = [None] * ctx.world_size
    dist.all_gather_object(digests, system.digests())
    same_tp = {}
    for r, d in enumerate(digests):
        same_tp.setdefault(mesh.coords(r)["tp"], set()).add(d["tp_slice"])
    model = bytes_model_per_dim(cfg, mesh, system.unit_shapes)
    states = model_states_model(mesh, system.unit_shapes)
    joined = system.whole_from_pieces()
    whole = {n: t.cpu() for n, t in system.whole_state()["weights"].items()}  # joined on the CPU
    pieces_ok = all(
        torch.is_tensor(t) and t.shape == whole[n].shape and t.dtype == whole[n].dtype and torch.equal(t, whole[n])
        for n, t in joined.items()
    ) and len(joined) == len(system.pieces)
    every_rank = [None] * ctx.world_size
    dist.all_gather_object(every_rank, (system.sent[-1] == model, system.census["total"], pieces_ok))
    return {
        "mesh": mesh.degrees(),
        "groups": {
            **{d: [list(g) for g in compose.groups_along(mesh, d)] for d in DIMS},
            "dp_shard_cp": [list(g) for g in compose.groups_along(mesh, compose.SHARD_DIMS)],
        },
        "whole_from_pieces": {"parameters": len(joined), "bit_identical_every_rank": all(ok for *_, ok in every_rank)},
        "final_loss": run.losses[-1],
        "bytes_per_dim": system.sent[-1],
        "bytes_model_per_dim": model,
        "bytes_every_rank_equal_model": all(same for same, *_ in every_rank),
        "memory_per_rank": {
            "measured": system.census["total"],
            "model": states,
            "every_rank": [held for _, held, _ in every_rank],
            "census": system.census,
        },
        "bytes_constant_over_steps": all(s == system.sent[0] for s in system.sent),
        "ranks_bit_identical": all(len(s) == 1 for s in same_tp.values()) and len({d["whole"] for d in digests}) == 1,
        "step_drift": run.summary() if args.check else None,
        "rulers": check.report,
    }


def run_pp_layout(cfg: TrainConfig, mesh: pp.PPMesh, args: argparse.Namespace, ctx: launch.DistContext) -> dict:
    """``pp x dp x tp`` (:mod:`minigpt.parallel.mesh.pp`) against one process with the harness's
    rulers, its bytes per dimension and model states against the model on every rank. PyTorch's own
    composition of ``torch.distributed.pipelining`` with tensor parallelism is not run here."""
    groups = pp.build_groups(mesh, ctx.rank)

    def build(c: TrainConfig) -> pp.PPSystem:
        return pp.PPSystem(c, mesh, groups, args.schedule, args.micro_batches, ctx.device, ctx.timeout_s)

    system, run, check = prove(build, cfg, name_of(mesh), args, ctx)
    if args.check:
        check.report.update(pytorch_impl=None, pytorch_impl_reason=PYTORCH_PP_REASON)
    stage = system.coords["pp"]
    model = pp.pp_bytes_model(cfg, mesh, stage, system.local_shapes())
    states = pp.pp_states_model(system.local_shapes())
    every_rank: list = [None] * ctx.world_size
    dist.all_gather_object(
        every_rank,
        (system.coords, system.sent[-1] == model, system.census["total"] == states, system.digests()),
    )
    same_stage: dict = {}
    for coords, *_, digests in every_rank:
        same_stage.setdefault((coords["pp"], coords["tp"]), set()).add(digests["stage"])
    tied = {d["tied"] for *_, d in every_rank if d["tied"] is not None}
    return {
        "mesh": mesh.degrees(),
        "groups": {d: [list(g) for g in mesh.groups(d)] for d in pp.PP_DIMS},
        "schedule": args.schedule,
        "micro_batches": args.micro_batches,
        "final_loss": run.losses[-1],
        "bytes_per_dim": system.sent[-1],
        "bytes_model_per_dim": model,
        "bytes_every_rank_equal_model": all(same for _, same, _, _ in every_rank),
        "memory_per_rank": {
            "measured": system.census["total"],
            "model": states,
            "every_rank_equal_model": all(held for _, _, held, _ in every_rank),
            "census": system.census,
        },
        "bytes_constant_over_steps": all(s == system.sent[0] for s in system.sent),
        "ranks_bit_identical": all(len(d) == 1 for d in same_stage.values()) and len(tied) <= 1,
        "step_drift": run.summary() if args.check else None,
        "rulers": check.report,
    }


PYTORCH_PP_REASON = (
    "PyTorch's pipeline schedules (torch.distributed.pipelining) beside its tensor parallelism and "
    "replicas are not run by this lab: Lab 06 holds our schedules to PyTorch's, Lab 05 our TP"
)


# ----------------------------------------------------------------------------------------------
# The command line


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = cli.torchrun_parser(PROG, __doc__, nproc="8")
    for d in DIMS:
        p.add_argument(
            f"--{d.replace('_', '-')}",
            type=cli.POSITIVE_INT,
            default=None,
            help=f"the {d} degree (all four or none: none runs the lab's two layouts)",
        )
    p.add_argument("--steps", type=cli.POSITIVE_INT, default=DEFAULT_STEPS, help="training steps of each layout")
    p.add_argument("--seed", type=cli.SEED, default=0, help="the weights and the batches")
    p.add_argument(
        "--pp",
        type=cli.POSITIVE_INT,
        default=1,
        help="pipeline stages: 2 or more runs pp x dp_replicate x tp (Lab 06's schedules, Lab 05's TP blocks)",
    )
    p.add_argument("--schedule", choices=("gpipe", "1f1b"), default=None, help="--pp: the schedule (default 1f1b)")
    p.add_argument(
        "--micro-batches", type=cli.POSITIVE_INT, default=None, help="--pp: micro-batches per step (default 4)"
    )
    entry.add_check_flags(p)
    entry.add_run_flags(p)
    p.add_argument(
        "--drop-cp-factor",
        action="store_true",
        help="a mistake on purpose: the CP ranks' loss shares averaged by FSDP instead of summed (the lab page's Surprises)",
    )
    cli.add_device_flag(p)
    return p.parse_args(argv)


def check_args(args: argparse.Namespace, world_size: int, local_world_size: int) -> tuple[TrainConfig, list[NDMesh]]:
    cfg = TrainConfig(steps=args.steps, seed=args.seed)
    given = {d: getattr(args, d) for d in DIMS if getattr(args, d) is not None}
    if given and len(given) != len(DIMS):
        missing = ", ".join(f"--{d.replace('_', '-')}" for d in DIMS if d not in given)
        raise ValueError(f"give all four degrees or none: {missing} missing")
    if args.pp > 1:
        return cfg, [pipeline_mesh(args, given, world_size, local_world_size, cfg)]
    for flag in ("schedule", "micro_batches"):
        if getattr(args, flag) is not None:
            name = flag.replace("_", "-")
            raise ValueError(f"--{name} {getattr(args, flag)}: it sets the pipeline of --pp; add --pp 2 or more")
    layouts = [given] if given else list(LAYOUTS.values())
    meshes = [
        check_degrees(
            world_size,
            local_world_size,
            degrees,
            n_head=cfg.n_head,
            seq_len=cfg.block_size,
            batch_size=cfg.batch_size,
        )
        for degrees in layouts
    ]
    return cfg, meshes


def pipeline_mesh(
    args: argparse.Namespace, given: dict, world_size: int, local_world_size: int, cfg: TrainConfig
) -> pp.PPMesh:
    """``--pp``'s mesh: the four degrees given, or tp 2 and the replicas that fill the world; a TP
    group inside a node, as in the other layouts."""
    args.schedule, args.micro_batches = args.schedule or "1f1b", args.micro_batches or 4
    if args.drop_cp_factor:
        raise ValueError("--drop-cp-factor is about context parallelism, which --pp does not run; leave it out")
    if not given:
        tp = 2 if world_size % (2 * args.pp) == 0 else 1
        if world_size % (args.pp * tp):
            raise ValueError(f"--pp {args.pp} does not divide the {world_size} ranks; give a divisor of {world_size}")
        given = {"dp_replicate": world_size // (args.pp * tp), "tp": tp}
    mesh = pp.check_pp_degrees(world_size, {**given, "pp": args.pp}, cfg, args.micro_batches)
    if local_world_size % mesh.tp:
        raise ValueError(
            f"--tp {mesh.tp} does not divide the {local_world_size} ranks of a node (LOCAL_WORLD_SIZE): a "
            f"tensor-parallel group would cross nodes; use a tp dividing {local_world_size}"
        )
    return mesh


def peak_rss_kb() -> int | None:
    """This process's peak resident memory in kB (``getrusage``'s ``ru_maxrss``: kB on Linux, bytes on
    macOS), or None where the ``resource`` module does not exist (Windows)."""
    try:
        import resource
    except ImportError:
        return None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak // 1024 if sys.platform == "darwin" else peak


def measure(cfg: TrainConfig, meshes: list[NDMesh], args: argparse.Namespace, ctx: launch.DistContext) -> dict:
    t_start = time.perf_counter()
    launch.log(
        ctx,
        f"MiniGPT {build_model(cfg).num_params():,} parameters | {ctx.world_size} ranks ({ctx.backend}) | "
        + " then ".join(m.describe() for m in meshes)
        + f" | {cfg.steps} steps",
    )
    layouts = {}
    for mesh in meshes:
        run = run_pp_layout if isinstance(mesh, pp.PPMesh) else run_layout
        layouts[name_of(mesh)] = run(cfg, mesh, args, ctx)
    first = next(iter(layouts.values()))
    peaks: list = [None] * ctx.world_size
    dist.all_gather_object(peaks, peak_rss_kb())
    report: dict = {
        "world_size": ctx.world_size,
        "steps": cfg.steps,
        "layouts": layouts,
        "bytes_per_dim": first["bytes_per_dim"],
        "bytes_model_per_dim": first["bytes_model_per_dim"],
        # each rank's own peak resident memory, and their sum: what the 8 processes need at most together
        "peak_rss_kb_per_rank": peaks,
        "peak_rss_kb": sum(peaks) if all(p is not None for p in peaks) else None,
        "drop_cp_factor": args.drop_cp_factor,
    }
    if args.check:
        rulers = [layout["rulers"] for layout in layouts.values()]
        report.update(proof.combined(rulers))
        report["ranks_bit_identical"] = all(layout["ranks_bit_identical"] for layout in layouts.values())
        theirs = [r for r in rulers if r.get("pytorch_impl")]
        if len(theirs) < len(rulers):  # --pp: no PyTorch composition to hold it against
            report.update(pytorch_impl=None, pytorch_impl_reason=PYTORCH_PP_REASON, pytorch_max_diff=None)
            report["same_as_pytorch"] = None
        else:
            report["pytorch_impl"] = "; ".join(f"{k}: {v['rulers']['pytorch_impl']}" for k, v in layouts.items())
            report.update(proof.against_pytorch(rulers))
        report.update(verdict(report).keys())
    return entry.finish(report, args, ctx, summary, t_start)


def verdict(report: dict) -> proof.Verdict:
    v = proof.Proof(proof.MODEL_PARALLEL, twin_norm="run", report=report).judge()
    for name, layout in report["layouts"].items():
        r = layout["rulers"]
        if "pytorch_drift_bound" not in r:  # --pp: bytes, memory and bits only (the drift is reported)
            pipeline_rulers(v, name, layout)
            continue
        v.at_most(
            f"{name}.fp32_max_step_drift",
            r["fp32_max_step_drift"],
            r["pytorch_drift_bound"],
            f"within 1e-5, or at most 2 x PyTorch's composition ({r['pytorch_fp32_max_step_drift']:.2e})",
        )
        v.at_most(
            f"{name}.pytorch_first_step_logit_diff",
            r["pytorch_first_step_logit_diff"],
            r["pytorch_one_step_bound"],
            "the whole batch's logits against PyTorch's composition",
        )
        bytes_rulers(v, name, layout, "each rank its own")
        memory = layout["memory_per_rank"]
        v.true(
            f"{name}.memory_per_rank",
            all(held == memory["model"] for held in memory["every_rank"]),
            f"model states after the step, every rank = {memory['model']:,} B",
        )
        v.true(f"{name}.ranks_bit_identical", layout["ranks_bit_identical"], "same tp coordinate, same bits")
        pieces = layout["whole_from_pieces"]
        v.true(
            f"{name}.whole_from_pieces",
            pieces["bit_identical_every_rank"],
            f"{pieces['parameters']} parameters joined from every rank's pieces (Exercise 7.3) = the gathered state",
        )
    return v


def bytes_rulers(v: proof.Verdict, name: str, layout: dict, whose: str) -> None:
    """A layout's bytes per dimension against the model: rank 0's, every rank's, every step's."""
    v.equal(f"{name}.bytes_per_dim", layout["bytes_per_dim"], layout["bytes_model_per_dim"], "rank 0")
    v.true(f"{name}.bytes_every_rank_equal_model", layout["bytes_every_rank_equal_model"], whose)
    v.true(f"{name}.bytes_constant_over_steps", layout["bytes_constant_over_steps"])


def pipeline_rulers(v: proof.Verdict, name: str, layout: dict) -> None:
    bytes_rulers(v, name, layout, "each rank its stage's")
    memory = layout["memory_per_rank"]
    v.true(
        f"{name}.memory_per_stage",
        memory["every_rank_equal_model"],
        f"model states after the step, each rank its stage's (rank 0: {memory['model']:,} B)",
    )
    v.true(
        f"{name}.stages_bit_identical",
        layout["ranks_bit_identical"],
        "same stage and tp coordinate, same bits; the two copies of the tied matrix too",
    )


def summary(report: dict) -> list[str]:
    lines = []
    for name, layout in report["layouts"].items():
        sent, model = layout["bytes_per_dim"], layout["bytes_model_per_dim"]
        parts = ", ".join(f"{d} {sent[d]:,} (model {model[d]:,})" for d in sent)
        memory = layout["memory_per_rank"]
        lines.append(
            f"{name}: bytes per step {parts}; model states per rank {memory['measured']:,} B (model "
            f"{memory['model']:,}); final loss {layout['final_loss']:.4f}"
        )
    if report.get("peak_rss_kb"):
        lines.append(
            f"peak resident memory, each rank's own summed over the {report['world_size']} ranks: {report['peak_rss_kb']:,} kB"
        )
    if report.get("rulers"):
        lines += proof.Verdict.of(report).lines()
    return lines


def check_settings(args: argparse.Namespace, world_size: int):
    _, local_world_size = torchrun_layout()
    return check_args(args, world_size, local_world_size)


LAB = entry.Lab(
    PROG,
    parse_args,
    check_settings,
    lambda settings, args, ctx: measure(*settings, args, ctx),
    "minigpt.pages.lab07:render",
    ("layouts", "bytes_per_dim"),
    "out/lab07.json",
    summary=summary,
)


def main(argv: list[str] | None = None) -> int:
    return entry.main(LAB, argv)
