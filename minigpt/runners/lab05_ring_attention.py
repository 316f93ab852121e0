"""Lab 05: context parallelism, ring attention by hand, held against full causal attention.

    torchrun --nproc_per_node=2 lab/05_ring_attention.py --check --report out/lab05-ring.json
    torchrun --nproc_per_node=4 lab/05_ring_attention.py --check --seq-lens 32 64 96

Each of the ``cp`` ranks holds a slice of the sequence's queries, keys and values; the key/value
blocks go round the ring (Lab 01's send/recv pattern) and each rank merges them into an online
softmax (:func:`~minigpt.parallel.tensor_parallel.ring_attention`). Every rank builds the same
random Q, K, V from ``--seed`` and computes full causal attention itself, so ``--check`` compares:

* **output and gradients** - this rank's rows of the output and its slices of dQ, dK, dV against
  full attention's, float32 (1e-5) and float64 (1e-12), for every ``--seq-lens`` length and both
  layouts (contiguous slices, and the load-balanced split: chunks ``r`` and ``2 cp - 1 - r``);
* **bytes** - what each rank sent, forward and backward, against ``(cp-1)/cp`` of K and V;
* **balance** - per rank, the scores causal attention needs (the visible keys of its queries) and
  the scores it computed (whole block products; a block pair with no visible key is skipped), in
  each layout;
* **PyTorch's own** - on CUDA only (its ring shards the fused attention kernels, which the CPU lacks),
  ``context_parallel`` with its load balance on float32 cases its kernel takes, beside ours, against
  the same full attention.

A length that ``cp`` (or ``2 cp``, load-balanced) does not divide is refused with a clear error:
this lab does not pad.
"""

from __future__ import annotations

import argparse
import math
import time

import torch
import torch.distributed as dist
from torch.nn import functional as F

from minigpt import cli, grammar, impl
from minigpt.parallel import bounds, equivalence, launch, proof
from minigpt.parallel.ring import ByteCounter
from minigpt.parallel.tensor_parallel import ring_attention, ring_attention_bytes, split_sequence
from minigpt.parallel.tensor_parallel.context_parallel import CPMiniGPT, cp_bytes_per_step
from minigpt.parallel.tensor_parallel.kit import kit_for
from minigpt.parallel.tensor_parallel.ring_attention import block_mask, positions
from minigpt.runners import entry
from minigpt.train import TrainConfig, build_model, build_optimizer, lr_at

PROG = "lab/05_ring_attention.py"
DEFAULT_CHECK_STEPS = 100  # --check: MiniGPT trained context-parallel for the first 100 of 450 steps (--full: all)
DTYPES = {"float32": torch.float32, "float64": torch.float64}


def full_causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """One process: softmax over the whole masked score matrix."""
    T = q.shape[2]
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
    scores = scores.masked_fill(~torch.ones(T, T, dtype=torch.bool, device=q.device).tril(), float("-inf"))
    return F.softmax(scores, dim=-1) @ v


def attention_inputs(
    args: argparse.Namespace, seq_len: int, dtype_name: str, device: torch.device
) -> tuple[torch.Tensor, ...]:
    """One case's Q, K, V and W (the weights of the output's sum, whose gradient comes back), the same
    on every rank: drawn on the CPU from ``--seed`` and the length, so that every device gets the
    same numbers, then moved to ``device``."""
    g = torch.Generator().manual_seed(args.seed + seq_len)
    shape = (args.batch, args.heads, seq_len, args.head_dim)
    return tuple(torch.randn(shape, generator=g, dtype=DTYPES[dtype_name]).to(device) for _ in range(4))


def one_case(args: argparse.Namespace, seq_len: int, balanced: bool, dtype_name: str, ctx) -> dict:
    """Ring attention against full attention on one length and layout: the differences of this
    rank's output and gradients, and the bytes and block products of this rank."""
    cp, rank = ctx.world_size, ctx.rank
    q, k, v, w = attention_inputs(args, seq_len, dtype_name, ctx.device)
    full = [t.clone().requires_grad_() for t in (q, k, v)]
    reference = full_causal_attention(*full)
    (reference * w).sum().backward()
    mine = [split_sequence(t, cp, rank, balanced).requires_grad_() for t in (q, k, v)]
    counter, computed = ByteCounter(), []
    out = ring_attention(*mine, counter=counter, load_balanced=balanced, computed=computed, kit=kit_for())
    sent_forward = counter.sent
    (out * split_sequence(w, cp, rank, balanced)).sum().backward()
    sent_backward = counter.sent - sent_forward
    expected = split_sequence(reference.detach(), cp, rank, balanced)
    grads = [split_sequence(t.grad, cp, rank, balanced) for t in full]
    return {
        "seq_len": seq_len,
        "load_balanced": balanced,
        "dtype": dtype_name,
        "max_out_diff": float((out.detach() - expected).abs().max()),
        "max_grad_diff": max(float((m.grad - e).abs().max()) for m, e in zip(mine, grads)),
        "bytes_forward": sent_forward,
        "bytes_backward": sent_backward,
        "bytes_model": ring_attention_bytes(
            args.batch, args.heads, seq_len, args.head_dim, cp, torch.finfo(DTYPES[dtype_name]).bits // 8
        ),
        "blocks_computed": len(computed),
        # per query row and head: the scores this rank computed (whole block products) and the
        # ones causal attention needs (the visible keys)
        "scores_computed": len(computed) * (seq_len // cp) ** 2,
        "scores_needed": sum(
            int(block_mask(positions(seq_len, cp, rank, balanced), positions(seq_len, cp, owner, balanced)).sum())
            for owner in computed
        ),
    }


def measure(args: argparse.Namespace, ctx: launch.DistContext) -> dict:
    t_start = time.perf_counter()
    launch.log(
        ctx,
        f"ring attention over {ctx.world_size} ranks ({ctx.backend}) | B {args.batch}, H {args.heads}, D "
        f"{args.head_dim}, T {', '.join(map(str, args.seq_lens))} | implementation: {impl.current()}",
    )
    cases = []
    for dtype_name in DTYPES:
        for seq_len in args.seq_lens:
            for balanced in (False, True):
                mine = one_case(args, seq_len, balanced, dtype_name, ctx)
                everyone = [None] * ctx.world_size
                dist.all_gather_object(everyone, mine)
                cases.append(
                    {
                        **{key: mine[key] for key in ("seq_len", "load_balanced", "dtype", "bytes_model")},
                        "max_out_diff": max(c["max_out_diff"] for c in everyone),
                        "max_grad_diff": max(c["max_grad_diff"] for c in everyone),
                        "bytes_forward": [c["bytes_forward"] for c in everyone],
                        "bytes_backward": [c["bytes_backward"] for c in everyone],
                        "blocks_computed": [c["blocks_computed"] for c in everyone],
                        "scores_computed": [c["scores_computed"] for c in everyone],
                        "scores_needed": [c["scores_needed"] for c in everyone],
                    }
                )
    f32 = [c for c in cases if c["dtype"] == "float32"]
    report = {
        "world_size": ctx.world_size,
        "cp": ctx.world_size,
        "implementation": impl.current(),
        "shape": {"batch": args.batch, "heads": args.heads, "head_dim": args.head_dim, "seq_lens": args.seq_lens},
        "cases": cases,
        "max_out_diff": max(c["max_out_diff"] for c in f32),
        "max_grad_diff": max(c["max_grad_diff"] for c in f32),
        # the longest length's bytes, float32, per rank (every rank sends the same)
        "bytes_per_rank": f32[-1]["bytes_forward"][0],
        "bytes_model": f32[-1]["bytes_model"],
        "refused": refusals(ctx),
    }
    verdict = proof.Verdict()
    for dtype_name, bound in bounds.KERNEL_BOUNDS.items():
        mine = [c for c in cases if c["dtype"] == dtype_name]
        verdict.at_most(f"attention_{dtype_name}_out_diff", max(c["max_out_diff"] for c in mine), bound, "every case")
        verdict.at_most(f"attention_{dtype_name}_grad_diff", max(c["max_grad_diff"] for c in mine), bound, "every case")
    verdict.true(
        "attention_bytes_match_model",
        all(set(c["bytes_forward"]) == set(c["bytes_backward"]) == {c["bytes_model"]} for c in cases),
        "(cp-1)/cp of K and V, forward and backward, every case",
    )
    verdict.true(
        "load_balanced_equal_work",
        all(len(set(c["scores_needed"])) == 1 for c in cases if c["load_balanced"]),
        "every rank needs the same scores",
    )
    verdict.true("lengths_refused", all(report["refused"].values()), "lengths the split cannot cut")
    if args.check:
        train_and_prove(args, ctx, report, verdict)
        report.update(verdict.keys())
    return entry.finish(report, args, ctx, summary, t_start)


class CPSystem:
    """MiniGPT trained with context parallelism (:class:`~minigpt.parallel.tensor_parallel.context_parallel.CPMiniGPT`,
    load-balanced) as the proof harness sees it: every rank every row, its tokens of each, on ``device``."""

    def __init__(self, cfg: TrainConfig, counter: ByteCounter | None = None, device: torch.device | str = "cpu"):
        self.cfg, self.counter, self.device = cfg, counter or ByteCounter(), torch.device(device)
        self.model = CPMiniGPT(build_model(cfg).to(device), load_balanced=True, counter=self.counter, kit=kit_for())
        self.optimizer = build_optimizer(self.model.model, cfg)
        self.sent: list[int] = []

    def _forward_backward(self, step: int):
        cfg = self.cfg
        batch = grammar.get_batch("train", step, cfg.batch_size, seed=cfg.seed, block_size=cfg.block_size)
        logits, share = self.model(*(t.to(self.device) for t in batch))
        share.backward()
        self.model.all_reduce_gradients()
        return logits, share

    def train_step(self, step: int) -> tuple[float, torch.Tensor | None]:
        cfg = self.cfg
        self.counter.reset()
        _, share = self._forward_backward(step)
        params = list(self.model.model.parameters())
        norm = torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip) if cfg.grad_clip > 0 else None
        for group in self.optimizer.param_groups:
            group["lr"] = lr_at(step, cfg.lr, cfg.min_lr, cfg.warmup, cfg.steps)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.sent.append(self.counter.sent)
        loss = share.detach().to(torch.float64).reshape(1)
        dist.all_reduce(loss)
        return float(loss[0]), norm

    def whole_state(self) -> dict:
        return proof.plain_state(self.model.model, self.optimizer)

    def first_step(self) -> proof.FirstStep:
        logits, _ = self._forward_backward(0)
        grads = {n: p.grad for n, p in self.model.model.named_parameters() if p.grad is not None}
        return proof.FirstStep(slice(None), logits.detach(), grads, self.model.positions(self.cfg.block_size))


PYTORCH_CP_REASON = (
    "torch.distributed.tensor.experimental.context_parallel needs scaled_dot_product_attention's CUDA "
    "kernels: on CPU it stops with 'Operator aten._scaled_dot_product_flash_attention_for_cpu.default does "
    "not have a sharding strategy registered' (torch 2.13)"
)
PYTORCH_CP_IMPL = (
    "torch.distributed.tensor.experimental.context_parallel around scaled_dot_product_attention "
    "(memory-efficient kernel, is_causal, PyTorch's head-tail load balance)"
)
PYTORCH_CP_NO_EQUALITY = (
    "no equality to hold: PyTorch's ring runs the fused memory-efficient attention kernel, ours matrix "
    "products and an online softmax; both are held against one process's attention"
)
PYTORCH_CP_LSE_ROWS = 32  # the memory-efficient kernel pads its log-sum-exp to a multiple of 32 queries


def pytorch_cp_lengths(args: argparse.Namespace, cp: int) -> list[int]:
    """The lengths PyTorch's ring can take in float32. Its memory-efficient kernel pads the log-sum-exp
    of a block of queries to a multiple of 32 rows, and PyTorch's ring merges the blocks' results
    unpadded, the load-balanced ones by halves of a rank's queries: each half, ``T / (2 cp)`` tokens,
    must be a multiple of 32 (a shorter one stops one rank in the merge while the others wait in the
    ring). The lab's lengths that are multiples of ``64 cp``, or else ``64 cp`` itself."""
    step = 2 * cp * PYTORCH_CP_LSE_ROWS
    return [t for t in args.seq_lens if t % step == 0] or [step]


def pytorch_context_parallel(args: argparse.Namespace, ctx: launch.DistContext) -> list[dict]:
    """PyTorch's context parallelism beside ours, float32, on CUDA (its ring shards the fused attention
    kernels, which the CPU does not have), on the lengths it takes (:func:`pytorch_cp_lengths`). Per
    length, the Q, K, V and W of :func:`one_case`: ours (:func:`one_case`, load-balanced), and PyTorch's
    ``context_parallel`` cutting the same tensors with its head-tail load balance, causal
    ``scaled_dot_product_attention`` on the memory-efficient kernel (the flash kernel takes half
    precision only), forward and backward inside the context (its dispatch of the backward ends with
    it). Over the ranks: the largest difference of each one's output and gradients from one process's
    full attention (:func:`full_causal_attention`), and whether PyTorch's cut of every tensor is our
    load-balanced one (chunks ``r`` and ``2 cp - 1 - r``), bit for bit."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.experimental import context_parallel
    from torch.nn.attention import SDPBackend, sdpa_kernel

    cp, rank = ctx.world_size, ctx.rank
    mesh = init_device_mesh(ctx.device.type, (cp,))
    cases = []
    for seq_len in pytorch_cp_lengths(args, cp):
        ours = one_case(args, seq_len, True, "float32", ctx)
        q, k, v, w = attention_inputs(args, seq_len, "float32", ctx.device)
        full = [t.clone().requires_grad_() for t in (q, k, v)]
        reference = full_causal_attention(*full)
        (reference * w).sum().backward()
        local = [t.clone() for t in (q, k, v, w)]  # context_parallel cuts these in place to this rank's tokens
        with context_parallel(mesh, buffers=local, buffer_seq_dims=[2] * 4, no_restore_buffers=set(local)):
            layout_same = all(
                torch.equal(mine, split_sequence(t, cp, rank, load_balanced=True))
                for mine, t in zip(local, (q, k, v, w))
            )
            for t in local[:3]:
                t.requires_grad_()
            with sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION):
                out = F.scaled_dot_product_attention(*local[:3], is_causal=True)  # looked up here: the patched one
                (out * local[3]).sum().backward()
        expected = split_sequence(reference.detach(), cp, rank, load_balanced=True)
        grads = [split_sequence(t.grad, cp, rank, load_balanced=True) for t in full]
        found = torch.tensor(
            [
                float((out.detach() - expected).abs().max()),
                max(float((m.grad - e).abs().max()) for m, e in zip(local[:3], grads)),
                float(not layout_same),
                ours["max_out_diff"],
                ours["max_grad_diff"],
            ],
            dtype=torch.float64,
            device=ctx.device,
        )
        dist.all_reduce(found, op=dist.ReduceOp.MAX)
        cases.append(
            {
                "seq_len": seq_len,
                "load_balanced": True,
                "dtype": "float32",
                "max_out_diff": float(found[0]),
                "max_grad_diff": float(found[1]),
                "layout_same": not bool(found[2]),
                "ours_max_out_diff": float(found[3]),
                "ours_max_grad_diff": float(found[4]),
            }
        )
    return cases


def pytorch_cp_reason(args: argparse.Namespace, ctx: launch.DistContext) -> str | None:
    """Why PyTorch's context parallelism cannot run here (None: it can): it needs CUDA, and its
    float32 kernel (memory-efficient attention) a head size that is a multiple of 4."""
    if ctx.device.type != "cuda":
        return PYTORCH_CP_REASON
    if args.head_dim % 4:
        return f"--head-dim {args.head_dim}: PyTorch's float32 attention kernel needs a multiple of 4"
    return None


def pytorch_keys(theirs: list[dict] | None, reason: str | None) -> dict:
    """The report's keys of PyTorch's own context parallelism: its cases
    (:func:`pytorch_context_parallel`), or none and why."""
    if theirs is None:
        return {
            "pytorch_impl": None,
            "pytorch_impl_reason": reason,
            "same_as_pytorch": None,
            "pytorch_max_diff": None,
        }
    return {
        "pytorch_impl": PYTORCH_CP_IMPL,
        "same_as_pytorch": None,
        "same_as_pytorch_reason": PYTORCH_CP_NO_EQUALITY,
        "pytorch_max_diff": max(max(c["max_out_diff"], c["max_grad_diff"]) for c in theirs),
        "pytorch_cases": theirs,
        "pytorch_layout_same": all(c["layout_same"] for c in theirs),
        "ours_max_diff_same_cases": max(max(c["ours_max_out_diff"], c["ours_max_grad_diff"]) for c in theirs),
    }


def train_and_prove(args: argparse.Namespace, ctx: launch.DistContext, report: dict, verdict: proof.Verdict) -> None:
    """The harness's rulers on MiniGPT trained with context parallelism: one step, float64, float32 over
    the first ``--check-steps`` steps (reported: every attention's sums are reordered), bytes, ranks; on
    CUDA, PyTorch's context parallelism on the attention cases beside ours."""
    reason = pytorch_cp_reason(args, ctx)
    theirs = pytorch_context_parallel(args, ctx) if reason is None else None
    cfg = TrainConfig(seed=args.seed)
    trained = entry.steps_trained(args, cfg.steps)
    check = proof.Proof(proof.MODEL_PARALLEL, twin_norm="run", report=report)
    check.first_step(lambda c: CPSystem(c, device=ctx.device), cfg, ctx)
    check.float64(lambda c: CPSystem(c, device=ctx.device), cfg, ctx, args.fp64_steps)
    launch.log(
        ctx,
        f"MiniGPT, context parallel: one step: logits {report['fp32_first_step_logit_diff']:.1e}, gradients "
        f"{report['fp32_first_step_grad_diff']:.1e} | float64: step drift {report['fp64_max_step_drift']:.1e} over "
        f"{report['fp64_steps']} steps; now {trained} float32 steps",
    )
    system = CPSystem(cfg, device=ctx.device)
    run = proof.run_with_twin(system, cfg, ctx, twin_norm="run", steps=trained)
    check.float32(run)
    digests = [None] * ctx.world_size
    dist.all_gather_object(digests, equivalence.params_digest(system.model.model))
    report["training"] = {
        "steps": trained,
        "schedule_steps": cfg.steps,
        "final_loss": run.losses[-1],
        "bytes_sent_per_step": system.sent[-1],
        "step_drift": run.summary(),
    }
    report.update(
        bytes_model_per_step=cp_bytes_per_step(
            cfg.batch_size, cfg.n_head, cfg.block_size, cfg.n_embd // cfg.n_head, cfg.n_layer, ctx.world_size
        ),
        ranks_bit_identical=len(set(digests)) == 1,
        **pytorch_keys(theirs, reason),
    )
    judged = check.judge()
    verdict.rulers += judged.rulers
    verdict.equal(
        "bytes_sent_per_step",
        report["training"]["bytes_sent_per_step"],
        report["bytes_model_per_step"],
        "ring attention",
    )
    verdict.true("ranks_bit_identical", report["ranks_bit_identical"], "every rank's weights after the run")
    if theirs is None:
        if ctx.device.type != "cuda":
            verdict.reported("pytorch_impl", "none on CPU", "context_parallel needs CUDA's attention kernels")
        else:
            verdict.reported("pytorch_impl", "none", reason)
        return
    verdict.true(
        "pytorch_layout_same", report["pytorch_layout_same"], "PyTorch's load-balanced cut is ours, bit for bit"
    )
    verdict.reported(
        "pytorch_max_diff",
        report["pytorch_max_diff"],
        f"PyTorch's context_parallel against one process, float32, output and gradients; ours "
        f"{report['ours_max_diff_same_cases']:.2e} on the same cases",
    )


def refusals(ctx: launch.DistContext) -> dict[str, str | None]:
    """The lengths the split must refuse, each with the message it gave (None: not refused)."""
    cp, found = ctx.world_size, {}
    for name, length, balanced in (("contiguous", cp + 1, False), ("load-balanced", 3 * cp, True)):
        try:
            split_sequence(torch.zeros(1, 1, length, 2), cp, ctx.rank, balanced)
            found[f"{name} T={length}"] = None
        except ValueError as exc:
            found[f"{name} T={length}"] = str(exc)
    return found


def summary(report: dict) -> list[str]:
    lines = []
    for c in report["cases"]:
        if c["dtype"] != "float32":
            continue
        lines.append(
            f"T {c['seq_len']:4d} {'load-balanced' if c['load_balanced'] else 'contiguous   '} | output "
            f"{c['max_out_diff']:.1e}, gradients {c['max_grad_diff']:.1e} | bytes forward {c['bytes_forward'][0]:,}, "
            f"backward {c['bytes_backward'][0]:,} (model {c['bytes_model']:,.0f}) | per rank: scores needed "
            f"{c['scores_needed']}, computed {c['scores_computed']}"
        )
    if report.get("pytorch_cases"):
        lines.append(
            "PyTorch's context_parallel (float32, load-balanced, cut as ours: "
            f"{'yes' if report['pytorch_layout_same'] else 'NO'}): "
            + "; ".join(
                f"T {c['seq_len']} output {c['max_out_diff']:.1e}, gradients {c['max_grad_diff']:.1e} (ours "
                f"{c['ours_max_out_diff']:.1e}, {c['ours_max_grad_diff']:.1e})"
                for c in report["pytorch_cases"]
            )
        )
    if "training" in report:
        t = report["training"]
        lines.append(
            f"MiniGPT, context parallel over {report['cp']} ranks (load-balanced): {t['steps']} of "
            f"{t['schedule_steps']} steps | loss {t['final_loss']:.4f} | ring attention bytes per rank per step "
            f"{t['bytes_sent_per_step']:,} (model {report['bytes_model_per_step']:,})"
        )
    if report.get("rulers"):
        lines += proof.Verdict.of(report).lines()
    return lines


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = cli.torchrun_parser(PROG, __doc__)
    p.add_argument("--seq-lens", type=cli.POSITIVE_INT, nargs="+", default=[32, 64, 128], help="sequence lengths")
    p.add_argument("--batch", type=cli.POSITIVE_INT, default=4, help="sequences per batch")
    p.add_argument("--heads", type=cli.POSITIVE_INT, default=4, help="attention heads")
    p.add_argument("--head-dim", type=cli.POSITIVE_INT, default=24, help="features per head (MiniGPT: 96 / 4)")
    p.add_argument("--seed", type=cli.SEED, default=0, help="the random Q, K, V")
    entry.add_check_flags(p, check_steps=DEFAULT_CHECK_STEPS)
    entry.add_run_flags(p, quiet=False)
    cli.add_device_flag(p)
    return p.parse_args(argv)


def check_args(args: argparse.Namespace, world_size: int) -> None:
    """ValueError naming a length the ring cannot cut (every length must divide into 2 cp chunks,
    since both layouts are run)."""
    bad = [t for t in args.seq_lens if t % (2 * world_size)]
    if bad:
        raise ValueError(
            f"--seq-lens {' '.join(map(str, bad))}: each length must be a multiple of 2 x cp = {2 * world_size} "
            f"(the load-balanced split cuts it into 2 cp chunks; this lab does not pad), e.g. "
            f"{2 * world_size * max(1, round(bad[0] / (2 * world_size)))}"
        )
    cli.need_world_size(world_size, 2, "ring attention needs a ring of 2 ranks or more")


LAB = entry.Lab(
    PROG,
    parse_args,
    check_args,
    lambda _, args, ctx: measure(args, ctx),
    "minigpt.pages.lab05:render",
    ("cases", "cp"),
    "lab/results/05-ring-attention-cpu.json",
)


def main(argv: list[str] | None = None) -> int:
    return entry.main(LAB, argv)
