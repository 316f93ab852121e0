"""Lab 05: MiniGPT cut by tensor parallelism (and sequence parallelism), held against one process.

    torchrun --nproc_per_node=2 lab/05_tensor_parallel.py                                 # train, tutor accuracy
    torchrun --nproc_per_node=2 lab/05_tensor_parallel.py --check --report out/lab05-tp.json  # ... and the proofs
    torchrun --nproc_per_node=2 lab/05_tensor_parallel.py --sequence-parallel              # with Megatron's SP
    torchrun --nproc_per_node=2 lab/05_tensor_parallel.py --check --impl exercises         # with your exercises

Every rank builds the same MiniGPT from ``--seed`` and keeps its slices
(:class:`~minigpt.parallel.tensor_parallel.TPMiniGPT`: heads, MLP columns, vocabulary rows). All
ranks see the whole batch; each computes its share of every layer. ``--check`` adds:

* **one step, one process** - the logits and every gradient of one forward and backward, gathered,
  against one process's on the same batch (float32 within 1e-5, float64 within 1e-12), with and
  without sequence parallelism;
* **bytes** - what each rank sends in that step, counted on Lab 01's ring, against theory page
  02's formula (:func:`~minigpt.parallel.tensor_parallel.tp_bytes_per_step`), the same with SP;
* **memory** - the parameter bytes each rank holds against the model's count, and the bytes of
  the activations autograd saves for backward, measured with and without SP;
* **training** - before every step the whole state (weights and AdamW moments, gathered) is loaded
  into a single-process MiniGPT that takes the same step; the largest logit difference on the
  probe batch after the two steps is the step drift (Lab 01's criterion, 1e-5); the same for a
  short float64 run (1e-12); the parameters every rank holds whole must stay bit-identical.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import time
from dataclasses import replace

import torch
import torch.distributed as dist

from minigpt import cli, grammar, impl
from minigpt.divergence import Watch
from minigpt.parallel import equivalence, launch
from minigpt.parallel.ring import ByteCounter
from minigpt.parallel.tensor_parallel import TPMiniGPT, gather_logits, padded_vocab_size, tp_bytes_per_step
from minigpt.parallel.tensor_parallel.kit import kit_for
from minigpt.train import TrainConfig, build_model, build_optimizer, lr_at

PROG = "lab/05_tensor_parallel.py"
FLOAT64_TOLERANCE = 1e-12
ONE_STEP_TOLERANCE = {"float32": 1e-5, "float64": 1e-12}


def cut(model: torch.nn.Module, sequence_parallel: bool, counter: ByteCounter | None = None) -> TPMiniGPT:
    """This rank's part of ``model``, built with the pieces of ``MINIGPT_IMPL`` (the reference or yours)."""
    return TPMiniGPT(model, sequence_parallel=sequence_parallel, counter=counter, kit=kit_for())


# ----------------------------------------------------------------------------------------------
# One forward and backward against one process


def saved_activation_bytes(run) -> int:
    """The bytes of the tensors autograd saves for backward while ``run()`` computes the forward
    (each storage counted once; parameters, which are not activations, left out)."""
    seen: dict[int, int] = {}
    params: set[int] = set()

    def pack(t: torch.Tensor):
        storage = t.untyped_storage()
        if storage.data_ptr() not in params:
            seen[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        result = run(params)
    return sum(seen.values()), result


def one_step(cfg: TrainConfig, dtype: torch.dtype) -> dict:
    """One forward and backward of MiniGPT on the first training batch, in one process and cut
    (TP, then TP with SP): logits, gradients, bytes, memory."""
    one = build_model(replace(cfg, dtype="float64" if dtype == torch.float64 else "float32"))
    x, y, mask = grammar.get_batch("train", 0, cfg.batch_size, seed=cfg.seed, block_size=cfg.block_size)

    def forward_one(params):
        params.update(p.untyped_storage().data_ptr() for p in one.parameters())
        return one(x, y, mask)

    one_saved, (logits, loss) = saved_activation_bytes(forward_one)
    loss.backward()
    grads = {n: p.grad for n, p in one.named_parameters()}
    out = {
        "one_process_saved_bytes": one_saved,
        "one_process_param_bytes": sum(p.numel() * p.element_size() for p in one.parameters()),
    }
    for sp in (False, True):
        counter = ByteCounter()
        model = cut(one, sp, counter)

        def forward_cut(params, model=model):
            params.update(p.untyped_storage().data_ptr() for p in model.parameters())
            return model(x, y, mask)

        saved, (local, tp_loss) = saved_activation_bytes(forward_cut)
        tp_loss.backward()
        model.sync_sequence_parallel_grads(ByteCounter())
        full_grads = model.full_state_dict(grads=True)
        out["sp" if sp else "tp"] = {
            "max_logit_diff": float(
                (gather_logits(local, cfg.model_config().vocab_size) - logits.detach()).abs().max()
            ),
            "loss_diff": abs(tp_loss.item() - loss.item()),
            "max_grad_diff": max(float((full_grads[k] - g).abs().max()) for k, g in grads.items()),
            "bytes_sent": counter.sent,
            "param_bytes": sum(p.numel() * p.element_size() for p in model.parameters()),
            "saved_activation_bytes": saved,
        }
    return out


def param_bytes_model(cfg: TrainConfig, tp: int, element_size: int = 4) -> int:
    """The parameter bytes one rank holds, counted from the shapes: the vocabulary padded to a
    multiple of tp and cut in tp; the attention and MLP weights (and the MLP's first bias) cut in
    tp; the position embedding, the layer norms and the row-parallel biases whole."""
    C, L = cfg.n_embd, cfg.n_layer
    vocab = padded_vocab_size(cfg.model_config().vocab_size, tp) // tp * C
    cut_per_block = (3 * C * C + C * C + 4 * C * C + 4 * C * C + 4 * C) // tp  # qkv, proj, fc, mlp proj, fc bias
    whole_per_block = 2 * 2 * C + C  # ln_1, ln_2 (weight, bias), the MLP proj's bias
    whole = cfg.block_size * C + 2 * C  # wpe, ln_f
    return (vocab + L * (cut_per_block + whole_per_block) + whole) * element_size


# ----------------------------------------------------------------------------------------------
# Training


def tp_step(
    model: TPMiniGPT, optimizer: torch.optim.Optimizer, step: int, cfg: TrainConfig
) -> tuple[float, torch.Tensor | None]:
    """:func:`minigpt.train.train_step` for a cut model: every rank the whole batch, the sequence-
    parallel gradients summed, the clipping by the whole model's norm. Returns the loss and the norm
    (None without clipping)."""
    x, y, mask = grammar.get_batch("train", step, cfg.batch_size, seed=cfg.seed, block_size=cfg.block_size)
    micro = len(x) // cfg.accum
    total = 0.0
    for i in range(cfg.accum):
        rows = slice(i * micro, (i + 1) * micro)
        _, loss = model(x[rows], y[rows], mask[rows])
        (loss / cfg.accum).backward()
        total += loss.item() / cfg.accum
    model.sync_sequence_parallel_grads(NORM_COUNTER)
    norm = model.clip_grad_norm_(cfg.grad_clip, NORM_COUNTER) if cfg.grad_clip > 0 else None
    for group in optimizer.param_groups:
        group["lr"] = lr_at(step, cfg.lr, cfg.min_lr, cfg.warmup, cfg.steps)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return total, norm


NORM_COUNTER = ByteCounter()  # the once-a-step all-reduces: SP's whole-parameter gradients, the norm


def whole_state(model: TPMiniGPT, optimizer: torch.optim.Optimizer) -> dict:
    """The cut model's weights and optimizer state (AdamW's moments, or SGD's momentum), gathered
    into MiniGPT's names (every rank)."""
    state = {"weights": model.full_state_dict(), "moments": {}, "step": None}
    first = next(iter(model.parameters()))
    for key in ("exp_avg", "exp_avg_sq", "momentum_buffer"):
        if key in optimizer.state.get(first, {}):
            state["moments"][key] = model.full_state_dict(of=lambda p, key=key: optimizer.state[p][key])
    if "step" in optimizer.state.get(first, {}):
        state["step"] = optimizer.state[first]["step"].clone()  # AdamW adds to it in place
    return state


def replicated_digest(model: TPMiniGPT) -> str:
    """A digest of the parameters every rank holds whole (they must stay bit-identical)."""
    cut_ids = {id(p) for p in model.sharded_parameters()}
    h = hashlib.sha256()
    for p in model.parameters():
        if id(p) not in cut_ids:
            h.update(p.detach().cpu().numpy().tobytes())
    return h.hexdigest()


def train(cfg: TrainConfig, args: argparse.Namespace, ctx: launch.DistContext, check: bool) -> dict:
    from tqdm import tqdm

    counter = ByteCounter()
    model = cut(build_model(cfg), args.sequence_parallel, counter)
    optimizer = build_optimizer(model, cfg)
    watch = Watch(model, cfg)
    twin = equivalence.Twin(cfg) if check and ctx.is_main else None
    drift, bit_identical, losses, seconds, sent = equivalence.DriftLog(), True, [], 0.0, []
    same_norm_drift = equivalence.DriftLog()
    bar = tqdm(
        range(cfg.steps),
        desc=f"[rank 0] train (tensor parallel {ctx.world_size}{' + SP' if args.sequence_parallel else ''}, {cfg.dtype})",
        disable=args.quiet or not ctx.is_main,
        dynamic_ncols=True,
        file=sys.stdout,
    )
    for step in bar:
        before = whole_state(model, optimizer) if check else None
        counter.reset()
        t0 = time.perf_counter()
        loss, norm = tp_step(model, optimizer, step, cfg)
        seconds += time.perf_counter() - t0
        sent.append(counter.sent)
        losses.append(loss)
        after = model.full_state_dict() if check else None
        watch.after_step(step, loss, model.named_parameters())
        if check:
            found = [0.0, 0.0]
            if twin:
                found[0] = twin.drift(step, before, after)
                if norm is not None:
                    found[1] = twin.drift(step, before, after, norm.detach())
            value = torch.tensor(found, dtype=torch.float64)
            dist.all_reduce(value, op=dist.ReduceOp.MAX)
            drift.add(float(value[0]))
            same_norm_drift.add(float(value[1]))
            digests = [None] * ctx.world_size
            dist.all_gather_object(digests, replicated_digest(model))
            bit_identical &= len(set(digests)) == 1
        if ctx.is_main:
            bar.set_postfix({"loss": f"{loss:.4f}", **({"step drift": f"{drift.final:.1e}"} if check else {})})
    bar.close()
    result = {
        "steps": cfg.steps,
        "dtype": cfg.dtype,
        "final_loss": losses[-1],
        "seconds_per_step": seconds / cfg.steps,
        "bytes_sent_per_step": sent[-1],
        "step_drift": drift.summary() if check else None,
        "step_drift_same_clip_norm": same_norm_drift.summary() if check and cfg.grad_clip > 0 else None,
        "replicated_bit_identical": bit_identical if check else None,
    }
    if cfg.dtype == "float32":
        full = build_model(cfg)
        full.load_state_dict(model.full_state_dict())
        accuracy = grammar.score(full, "test", max_sentences=args.test_sentences, block_size=cfg.block_size)
        result.update(
            tutor_accuracy=accuracy["accuracy"], tutor_correct=accuracy["correct"], tutor_total=accuracy["total"]
        )
    return result


# ----------------------------------------------------------------------------------------------
# The command line


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = cli.torchrun_parser(PROG, __doc__)
    p.add_argument("--steps", type=cli.POSITIVE_INT, default=TrainConfig().steps, help="training steps")
    p.add_argument("--seed", type=cli.SEED, default=0, help="the weights and the batches")
    p.add_argument("--tp", type=cli.POSITIVE_INT, default=None, help="tensor-parallel degree (default: the world size)")
    p.add_argument(
        "--dp", type=cli.POSITIVE_INT, default=None, help="data-parallel degree; tp * dp must be the world size"
    )
    p.add_argument("--sequence-parallel", action="store_true", help="train with Megatron's sequence parallelism")
    p.add_argument("--optimizer", choices=("adamw", "sgd"), default="adamw", help="the optimizer (as Lab 01's)")
    p.add_argument("--lr", type=cli.POSITIVE, default=TrainConfig().lr, help="peak learning rate")
    p.add_argument("--min-lr", type=cli.NON_NEGATIVE, default=TrainConfig().min_lr, help="final learning rate")
    p.add_argument("--check", action="store_true", help="the proofs: one process, bytes, memory, step drift")
    p.add_argument("--float64-steps", type=cli.NON_NEGATIVE_INT, default=10, help="--check: steps of the float64 run")
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
    """The settings, or ValueError naming the value that cannot work and what would."""
    cfg = TrainConfig(steps=args.steps, seed=args.seed, optimizer=args.optimizer, lr=args.lr, min_lr=args.min_lr)
    tp = world_size if args.tp is None else args.tp
    if world_size % tp:
        raise ValueError(
            f"--tp {tp} does not divide the world size {world_size}: tp * dp must equal it (e.g. --tp {world_size})"
        )
    dp = world_size // tp if args.dp is None else args.dp
    if tp * dp != world_size:
        raise ValueError(
            f"--tp {tp} x --dp {dp} = {tp * dp} ranks, but the world size is {world_size}: tp * dp must equal it"
        )
    if dp != 1:
        raise ValueError(
            f"--dp {dp}: this lab cuts one model over all {world_size} ranks (dp 1, tp {world_size}); "
            "data parallelism across tensor-parallel groups (DP x TP) is Lab 06's"
        )
    if cfg.n_head % tp:
        raise ValueError(f"--tp {tp} does not divide MiniGPT's {cfg.n_head} attention heads; use a divisor of it")
    if 4 * cfg.n_embd % tp:
        raise ValueError(f"--tp {tp} does not divide the MLP's {4 * cfg.n_embd} features; use a divisor of it")
    if args.sequence_parallel and cfg.block_size % tp:
        raise ValueError(f"--sequence-parallel needs --tp {tp} to divide the {cfg.block_size} tokens of a sequence")
    if args.check:
        cli.need_world_size(world_size, 2, "--check compares a model cut over 2 ranks or more with one process")
    if args.report:
        cli.output_file(args.report, "--report")
    return cfg


def measure(cfg: TrainConfig, args: argparse.Namespace, ctx: launch.DistContext) -> dict:
    t_start = time.perf_counter()
    tp = ctx.world_size
    launch.log(
        ctx,
        f"MiniGPT {build_model(cfg).num_params():,} parameters | tensor parallel over {tp} ranks ({ctx.backend})"
        f"{', sequence parallel' if args.sequence_parallel else ''} | {cfg.steps} steps | implementation: "
        f"{impl.current()}",
    )
    report: dict = {
        "world_size": ctx.world_size,
        "tp": tp,
        "dp": 1,
        "sequence_parallel": args.sequence_parallel,
        "implementation": impl.current(),
        "optimizer": cfg.optimizer,
        "lr": cfg.lr,
        "bytes_model": tp_bytes_per_step(cfg.batch_size, cfg.block_size, cfg.n_embd, cfg.n_layer, tp),
        "param_bytes_model": param_bytes_model(cfg, tp),
    }
    if args.check:
        report["one_step"] = {"float32": one_step(cfg, torch.float32), "float64": one_step(cfg, torch.float64)}
        f32 = report["one_step"]["float32"]
        report.update(
            max_logit_diff=max(f32["tp"]["max_logit_diff"], f32["sp"]["max_logit_diff"]),
            max_grad_diff=max(f32["tp"]["max_grad_diff"], f32["sp"]["max_grad_diff"]),
        )
        launch.log(
            ctx,
            f"one step: logits {report['max_logit_diff']:.1e}, gradients {report['max_grad_diff']:.1e} from one "
            f"process | bytes TP {f32['tp']['bytes_sent']:,}, SP {f32['sp']['bytes_sent']:,}, formula "
            f"{report['bytes_model']:,.0f}; now training",
        )
    report["training"] = train(cfg, args, ctx, args.check)
    t = report["training"]
    report.update(tutor_accuracy=t["tutor_accuracy"], bytes_per_rank_per_step=t["bytes_sent_per_step"])
    if args.check:
        f64 = train(replace(cfg, dtype="float64", steps=max(1, args.float64_steps)), args, ctx, True)
        report["float64"] = {"steps": f64["steps"], "step_drift": f64["step_drift"]}
        one = report["one_step"]
        report.update(max_step_drift=t["step_drift"]["max"], replicated_bit_identical=t["replicated_bit_identical"])
        report["passed"] = bool(
            all(
                one[d][m][k] <= ONE_STEP_TOLERANCE[d]
                for d in one
                for m in ("tp", "sp")
                for k in ("max_logit_diff", "max_grad_diff")
            )
            and report["max_step_drift"] <= equivalence.TOLERANCE
            and report["float64"]["step_drift"]["max"] <= FLOAT64_TOLERANCE
            and report["replicated_bit_identical"]
            and report["bytes_per_rank_per_step"] == report["bytes_model"]
            and one["float32"]["tp"]["bytes_sent"] == one["float32"]["sp"]["bytes_sent"] == report["bytes_model"]
            and one["float64"]["tp"]["bytes_sent"] == one["float64"]["sp"]["bytes_sent"] == 2 * report["bytes_model"]
            and one["float32"]["tp"]["param_bytes"] == report["param_bytes_model"]
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
        f"(formula {report['bytes_model']:,.0f})",
    )
    if "passed" in report:
        one = report["one_step"]
        launch.log(
            ctx,
            f"check {'PASS' if report['passed'] else 'FAIL'}: one step: logits {report['max_logit_diff']:.1e}, "
            f"gradients {report['max_grad_diff']:.1e} (float32, <= 1e-5), "
            f"{max(one['float64'][m]['max_grad_diff'] for m in ('tp', 'sp')):.1e} (float64, <= 1e-12) | step drift "
            f"{report['max_step_drift']:.2e} (<= 1e-5), {report['float64']['step_drift']['max']:.2e} (float64) | "
            f"whole parameters bit-identical on every rank: {report['replicated_bit_identical']} | parameters per "
            f"rank {one['float32']['tp']['param_bytes']:,} B (model {report['param_bytes_model']:,}) | saved "
            f"activations: one process {one['float32']['one_process_saved_bytes']:,} B, TP "
            f"{one['float32']['tp']['saved_activation_bytes']:,}, SP {one['float32']['sp']['saved_activation_bytes']:,}",
        )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.render:
        from minigpt.pages import lab05

        try:
            cli.input_json(args.render, "--render", ("training", "tp"), "lab/results/05-tensor-parallel-cpu.json")
        except ValueError as exc:
            return cli.refuse(PROG, str(exc))
        for path in lab05.render(args.render):
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
