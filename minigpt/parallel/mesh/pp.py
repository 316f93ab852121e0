"""Lab 07's pipeline dimension: pipeline x data x tensor parallelism (``pp x dp x tp``) on one mesh.

A world of ``pp * dp * tp`` ranks is a 3-D grid, ``(pp, dp, tp)`` from the outermost to the
innermost (torchtitan's and Megatron-LM's order, without the shard and context dimensions): the
ranks of a tensor-parallel group are consecutive (an all-reduce in every block stays on a node's
fast links), the replicas come next (one all-reduce of the gradients per step), and the stages are
outermost: what crosses from one stage to the next is one micro-batch's activations at a time, the
lightest traffic of the three, so it is the one that may cross the slow links between nodes. With 8
ranks, ``pp 2 x dp 2 x tp 2``::

    rank:  0  1  2  3  4  5  6  7
    pp:    0  0  0  0  1  1  1  1
    dp:    0  0  1  1  0  0  1  1
    tp:    0  1  0  1  0  1  0  1

Each replica is one of Lab 06's pipelines: its stage ranks ``(0, d, t) ... (pp-1, d, t)`` run a
schedule (GPipe or 1F1B) on the replica's rows of the batch, cut into micro-batches. Each stage's
blocks are Lab 05's :class:`~minigpt.parallel.tensor_parallel.model.TPBlock` over the stage's tp
group; the embeddings, the final norm and the output layer stay whole on every rank of their
stage, so the activations a stage sends are whole and the same on its tp ranks: rank ``(s, d, t)``
sends to ``(s+1, d, t)``. After the schedule, the first and the last stage swap their halves of the
tied matrix's gradient (Lab 06), the replicas average every gradient (one all-reduce over dp, the
buffer padded to a multiple of dp), and the norm is the whole model's: squares of the TP slices
summed over tp, the whole tensors counted once, the stages summed over pp.

Only ``dp_replicate`` composes with the pipeline here: FSDP or context parallelism inside a stage
(torchtitan's 4-D) is refused by :func:`check_pp_degrees`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from minigpt import grammar
from minigpt.fsdp.memory import model_state_bytes
from minigpt.parallel import equivalence, proof
from minigpt.parallel.fsdp_by_hand.record import ring_sent_bytes
from minigpt.parallel.mesh.compose import whole_parameter
from minigpt.parallel.pipeline import (
    SCHEDULES,
    Link,
    MicroBatches,
    PipelineStage,
    backward_step,
    check_schedule,
    forward_only,
    forward_step,
    run_schedule,
    schedule_orders,
    stage_blocks,
    step_bytes_model,
    sync_tied_gradient,
)
from minigpt.parallel.ring import ByteCounter
from minigpt.parallel.tensor_parallel import comm
from minigpt.parallel.tensor_parallel.model import TPBlock, ring_all_reduce_bytes
from minigpt.train import TrainConfig, build_model, build_optimizer, lr_at

PP_DIMS = ("pp", "dp", "tp")
# how tensor parallelism cuts a block's tensors (name suffix -> (dim, parts)); the rest are whole
TP_CUT = {
    "attn.qkv.weight": (0, 3),
    "attn.qkv.bias": (0, 3),
    "attn.proj.weight": (1, 1),
    "mlp.fc.weight": (0, 1),
    "mlp.fc.bias": (0, 1),
    "mlp.proj.weight": (1, 1),
}


@dataclass(frozen=True)
class PPMesh:
    """The degrees of ``pp x dp x tp``; coordinates and groups follow from them."""

    pp: int = 1
    dp: int = 1
    tp: int = 1

    @property
    def world_size(self) -> int:
        return self.dp * self.pp * self.tp

    def degrees(self) -> dict[str, int]:
        return {"pp": self.pp, "dp": self.dp, "tp": self.tp}

    def coords(self, rank: int) -> dict[str, int]:
        s, rest = divmod(rank, self.dp * self.tp)
        return {"pp": s, "dp": rest // self.tp, "tp": rest % self.tp}

    def rank(self, pp: int, dp: int, tp: int) -> int:
        return (pp * self.dp + dp) * self.tp + tp

    def groups(self, dim: str) -> list[tuple[int, ...]]:
        """The groups along ``dim``: the ranks whose other two coordinates are equal."""
        sizes = self.degrees()
        others = [d for d in PP_DIMS if d != dim]
        out = []
        for a in range(sizes[others[0]]):
            for b in range(sizes[others[1]]):
                fixed = {others[0]: a, others[1]: b}
                out.append(tuple(self.rank(**{**fixed, dim: i}) for i in range(sizes[dim])))
        return sorted(out)

    def describe(self) -> str:
        return f"pp {self.pp} x dp {self.dp} x tp {self.tp} = {self.world_size} ranks"


def check_pp_degrees(world_size: int, degrees: dict[str, int], cfg: TrainConfig, micro_batches: int) -> PPMesh:
    """The mesh, or ValueError naming the value that cannot work (before any process group exists)."""
    if degrees.get("dp_shard", 1) != 1 or degrees.get("cp", 1) != 1:
        raise ValueError(
            f"--pp {degrees['pp']} composes with --dp-replicate and --tp only: give --dp-shard 1 --cp 1 "
            f"(got --dp-shard {degrees.get('dp_shard', 1)} --cp {degrees.get('cp', 1)})"
        )
    mesh = PPMesh(degrees["pp"], degrees.get("dp_replicate", 1), degrees.get("tp", 1))
    if mesh.world_size != world_size:
        raise ValueError(f"{mesh.describe()}, but this run has {world_size} ranks: the degrees must multiply to it")
    if mesh.pp > cfg.n_layer:
        raise ValueError(f"--pp {mesh.pp}: MiniGPT has {cfg.n_layer} blocks; use 2 to {cfg.n_layer} stages")
    if cfg.n_head % mesh.tp:
        raise ValueError(f"--tp {mesh.tp} does not divide the {cfg.n_head} attention heads")
    if cfg.batch_size % mesh.dp:
        raise ValueError(
            f"--dp-replicate {mesh.dp}: the batch of {cfg.batch_size} rows does not split over {mesh.dp} replicas; "
            f"give a divisor of {cfg.batch_size}"
        )
    rows = cfg.batch_size // mesh.dp
    if rows % micro_batches:
        raise ValueError(
            f"--micro-batches {micro_batches}: each replica's {cfg.batch_size} / {mesh.dp} rows must cut into "
            f"equal micro-batches; give a divisor of {rows}"
        )
    return mesh


def build_groups(mesh: PPMesh, rank: int) -> dict[str, dist.ProcessGroup]:
    """This rank's group along each dimension (every rank creates every group, in the same order)."""
    mine = {}
    for dim in PP_DIMS:
        for ranks in mesh.groups(dim):
            group = dist.new_group(list(ranks))
            if rank in ranks:
                mine[dim] = group
    return mine


class TPStage(PipelineStage):
    """A pipeline stage whose blocks are cut over ``tp_group`` (Lab 05's blocks; the rest whole)."""

    def __init__(self, model, stage: int, stages: int, tp_group, counter: ByteCounter):
        super().__init__(model, stage, stages)
        cfg = model.config
        self.blocks = nn.ModuleList(
            TPBlock(b, cfg.n_head, cfg.block_size, tp_group, counter=counter) for b in self.blocks
        )

    def cut(self, name: str) -> tuple[int, int] | None:
        """How tensor parallelism cuts the tensor of MiniGPT name ``name``: ``(dim, parts)``, or None."""
        return TP_CUT.get(name.split(".", 2)[2]) if name.startswith("blocks.") else None


class PPSystem:
    """MiniGPT on ``pp x dp x tp``, as the proof harness sees it (every rank of the world)."""

    def __init__(
        self,
        cfg: TrainConfig,
        mesh: PPMesh,
        groups: dict,
        schedule: str = "1f1b",
        micro_batches: int = 4,
        device: torch.device | str = "cpu",
        timeout_s: float = 300.0,
    ):
        self.cfg, self.mesh, self.groups, self.m = cfg, mesh, groups, micro_batches
        self.device = torch.device(device)
        self.rank = dist.get_rank()
        self.coords = mesh.coords(self.rank)
        s, d, t = (self.coords[k] for k in PP_DIMS)
        rows = cfg.batch_size // mesh.dp
        self.rows = slice(d * rows, (d + 1) * rows)
        self.counters = {dim: ByteCounter() for dim in PP_DIMS}
        self.stage = TPStage(build_model(cfg).to(self.device), s, mesh.pp, groups["tp"], self.counters["tp"])
        self.names = [n for n, _ in build_model(cfg).named_parameters()]
        self.optimizer = build_optimizer(self.stage, cfg)
        self.orders = schedule_orders(SCHEDULES[schedule], mesh.pp, micro_batches)
        check_schedule(self.orders, micro_batches)
        dtype = torch.float64 if cfg.dtype == "float64" else torch.float32
        shape = (rows // micro_batches, cfg.block_size, cfg.n_embd)
        stage_ranks = [mesh.rank(i, d, t) for i in range(mesh.pp)]
        self.link = Link(s, stage_ranks, shape, dtype, timeout_s, self.counters["pp"], self.device)
        self.ends = (stage_ranks[0], stage_ranks[-1])
        self.sent: list[dict[str, int]] = []
        self.census: dict = {}  # the model states after the last optimizer step, gradients still held
        self.optimizer.register_step_post_hook(
            lambda *_: self.census.update(model_state_bytes(self.stage, self.optimizer))
        )

    def batch(self, step: int) -> tuple[torch.Tensor, ...]:
        """This replica's rows of ``step``'s batch (every stage reads them: tokens first, targets last)."""
        cfg = self.cfg
        batch = grammar.get_batch("train", step, cfg.batch_size, seed=cfg.seed, block_size=cfg.block_size)
        return tuple(t[self.rows].to(self.device) for t in batch)

    def forward_backward(self, step: int) -> float:
        """The schedule on ``step``'s rows, the tied matrix's halves swapped, the replicas averaged;
        returns the replica's loss (last stage; 0 elsewhere)."""
        batches = MicroBatches.cut(*self.batch(step), self.m)
        record = run_schedule(
            self.stage, self.orders[self.coords["pp"]], batches, self.link, forward_step, backward_step
        )
        sync_tied_gradient(self.stage, *self.ends, self.counters["pp"])
        self.average_replicas()
        return record.loss if self.stage.is_last else 0.0

    @torch.no_grad()
    def average_replicas(self) -> None:
        grads = [p.grad for p in self.stage.parameters() if p.grad is not None]
        if self.mesh.dp == 1 or not grads:
            return
        flat = torch.cat([g.reshape(-1) for g in grads])
        flat = torch.cat([flat, flat.new_zeros(-len(flat) % self.mesh.dp)])  # a multiple of dp: equal chunks
        flat = comm.all_reduce(flat, self.groups["dp"], self.counters["dp"]) / self.mesh.dp
        offset = 0
        for g in grads:
            g.copy_(flat[offset : offset + g.numel()].view_as(g))
            offset += g.numel()

    @torch.no_grad()
    def clip_grad_norm_(self, max_norm: float) -> torch.Tensor:
        """The whole model's gradient norm (the TP slices' squares summed over tp, the whole tensors
        counted once, the stages summed over pp; the last stage's copy of the tied matrix left out),
        and every gradient scaled as one process's ``clip_grad_norm_`` scales it."""
        named = [(n, p) for n, p in self.stage.named_in_model() if p.grad is not None]
        zero = torch.zeros(self.mesh.tp, dtype=named[0][1].grad.dtype, device=self.device)
        cut, whole = zero.clone(), zero.clone()
        for name, p in named:
            if name == "lm_head.weight" and not self.stage.is_first:
                continue
            square = torch.linalg.vector_norm(p.grad) ** 2
            (cut if self.stage.cut(name) else whole)[0] += square
        stage = comm.all_reduce(cut, self.groups["tp"], self.counters["tp"])[0] + whole[0]
        padded = torch.cat([stage.reshape(1), stage.new_zeros(self.mesh.pp - 1)])
        norm = comm.all_reduce(padded, self.groups["pp"], self.counters["pp"])[0].sqrt()
        scale = (max_norm / (norm + 1e-6)).clamp(max=1.0)
        for _, p in named:
            p.grad.mul_(scale)
        return norm

    def train_step(self, step: int) -> tuple[float, torch.Tensor | None]:
        for counter in self.counters.values():
            counter.reset()
        loss = self.forward_backward(step)
        norm = self.clip_grad_norm_(self.cfg.grad_clip) if self.cfg.grad_clip > 0 else None
        for group in self.optimizer.param_groups:
            group["lr"] = lr_at(step, self.cfg.lr, self.cfg.min_lr, self.cfg.warmup, self.cfg.steps)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.sent.append({dim: self.counters[dim].sent for dim in PP_DIMS})
        total = torch.tensor([loss if self.coords["tp"] == 0 else 0.0], dtype=torch.float64, device=self.device)
        dist.all_reduce(total)  # each replica's loss once (its last stage, tp rank 0)
        return float(total[0]) / self.mesh.dp, norm

    # -- the whole model, from every stage's TP slices ----------------------------------------------

    def _stage_whole(self, value) -> dict[str, torch.Tensor]:
        """``value(p)`` of every parameter of this stage, whole over tp (one all-gather), on the CPU."""
        named = self.stage.named_in_model()
        cut = [(n, value(p).contiguous()) for n, p in named if self.stage.cut(n)]
        out = {n: value(p).detach().to("cpu", copy=True) for n, p in named if not self.stage.cut(n)}
        if cut:
            flat = torch.cat([t.reshape(-1) for _, t in cut])
            everyone = [torch.empty_like(flat) for _ in range(self.mesh.tp)]
            dist.all_gather(everyone, flat, group=self.groups["tp"])
            offset = 0
            for name, t in cut:
                pieces = [[r[offset : offset + t.numel()].view_as(t).cpu()] for r in everyone]
                offset += t.numel()
                dim, parts = self.stage.cut(name)
                out[name] = whole_parameter(pieces, t.shape[0], dim, parts)
        return out

    def _whole(self, value) -> dict[str, torch.Tensor]:
        """Every stage's :meth:`_stage_whole` on every rank, in MiniGPT's parameter order."""
        mine = self._stage_whole(value)
        keep = self.coords["dp"] == 0 and self.coords["tp"] == 0
        everyone: list = [None] * dist.get_world_size()
        dist.all_gather_object(everyone, mine if keep else None)
        joined = {k: v for part in everyone if part for k, v in part.items()}
        return {n: joined[n].to(self.device) for n in [*self.names, "lm_head.weight"] if n in joined}

    def whole_state(self) -> dict:
        first = next(iter(self.stage.parameters()))
        state = {"weights": self._whole(lambda p: p.detach()), "moments": {}, "step": None}
        for key in ("exp_avg", "exp_avg_sq"):
            if key in self.optimizer.state.get(first, {}):
                state["moments"][key] = self._whole(lambda p, key=key: self.optimizer.state[p][key])
        if "step" in self.optimizer.state.get(first, {}):
            state["step"] = self.optimizer.state[first]["step"].clone()
        return state

    def first_step(self) -> proof.FirstStep:
        logits = forward_only(self.stage, MicroBatches.cut(*self.batch(0), self.m), self.link)
        self.forward_backward(0)
        named = {n: p for n, p in self.stage.named_in_model() if p.grad is not None}
        grads = self._stage_whole(lambda p: p.grad)
        return proof.FirstStep(self.rows, logits, {n: g.to(self.device) for n, g in grads.items() if n in named})

    def digests(self) -> dict[str, str]:
        """This stage's TP-local tensors (the same bits on every replica) and its copy of the tied
        matrix (the same bits on the first and the last stage)."""
        tied = self.stage.tied_weight()
        return {
            "stage": equivalence.digest(p for _, p in self.stage.named_in_model()),
            "tied": None if tied is None else equivalence.digest([tied]),
        }

    def local_shapes(self) -> list[tuple[int, ...]]:
        return [tuple(p.shape) for p in self.stage.parameters()]


def pp_bytes_model(cfg: TrainConfig, mesh: PPMesh, stage: int, local_shapes: list[tuple[int, ...]]) -> dict[str, int]:
    """One rank's bytes in one step along each dimension, from the formulas of the labs that taught
    them (float32), for stage ``stage`` holding TP-local tensors of ``local_shapes``:

    * ``tp``: theory page 02's four all-reduces of ``(B/dp, T, C)`` per block of the stage (two
      forward, two backward), plus the norm's squares (``tp`` numbers);
    * ``pp``: Lab 06's activations down and gradients up for the replica's rows, the tied matrix's
      swap (first and last stage), plus the norm's sum over the stages (``pp`` numbers);
    * ``dp``: the replicas' all-reduce of every gradient, padded to a multiple of ``dp``.
    """
    rows, blocks = cfg.batch_size // mesh.dp, len(stage_blocks(cfg.n_layer, mesh.pp)[stage])
    activations = rows * cfg.block_size * cfg.n_embd * 4
    tp = 4 * blocks * ring_all_reduce_bytes(activations, mesh.tp) + ring_sent_bytes("all-reduce", 4 * mesh.tp, mesh.tp)
    vocab = cfg.model_config().vocab_size
    pp = step_bytes_model(mesh.pp, stage, rows, cfg.block_size, cfg.n_embd, vocab, 4)
    pp += ring_sent_bytes("all-reduce", 4 * mesh.pp, mesh.pp)
    elements = sum(int(torch.Size(s).numel()) for s in local_shapes)
    dp = ring_sent_bytes("all-reduce", 4 * (elements + (-elements % mesh.dp)), mesh.dp)
    return {"pp": int(pp), "dp": int(dp), "tp": round(tp)}


def pp_states_model(local_shapes: list[tuple[int, ...]]) -> int:
    """The model states one rank holds after an AdamW step (float32): its stage's TP-local tensors as
    weights (4 bytes an element), gradients (4) and AdamW's two moments (8), and a step counter each."""
    elements = sum(int(torch.Size(s).numel()) for s in local_shapes)
    return 16 * elements + 4 * len(local_shapes)
