"""Lab 05: MiniGPT cut by tensor parallelism (and sequence parallelism), held against one process.

    torchrun --nproc_per_node=2 lab/05_tensor_parallel.py                                 # train, tutor accuracy
    torchrun --nproc_per_node=2 lab/05_tensor_parallel.py --check --report out/lab05-tp.json  # ... and the proofs
    torchrun --nproc_per_node=2 lab/05_tensor_parallel.py --sequence-parallel              # with Megatron's SP
    torchrun --nproc_per_node=2 lab/05_tensor_parallel.py --check --impl exercises         # with your exercises

Every rank builds the same MiniGPT from ``--seed`` and keeps its slices
(:class:`~minigpt.parallel.tensor_parallel.TPMiniGPT`: heads, MLP columns, vocabulary rows). All
ranks see the whole batch; each computes its share of every layer. ``--check`` adds:

* **one step, one process** - the logits and every gradient of one forward and backward, gathered,
  against one process's on the same batch (float32 within 1e-5, float64 within 1e-9), with and
  without sequence parallelism;
* **bytes** - what each rank sends in that step, counted on Lab 01's ring, against theory page
  02's formula (:func:`~minigpt.parallel.tensor_parallel.tp_bytes_per_step`), the same with SP;
* **memory** - the parameter bytes each rank holds against the model's count, and the bytes of
  the activations autograd saves for backward, measured with and without SP;
* **training** - before every step the whole state (weights and AdamW moments, gathered) is loaded
  into a single-process MiniGPT that takes the same step; the largest logit difference on the
  probe batch after the two steps is the step drift (Lab 01's criterion, 1e-5); the same for a
  short float64 run (1e-9); the parameters every rank holds whole must stay bit-identical.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace

import torch
import torch.distributed as dist

from minigpt import cli, grammar, impl
from minigpt.divergence import Watch
from minigpt.parallel import launch, proof
from minigpt.parallel.ring import ByteCounter
from minigpt.parallel.tensor_parallel import TPMiniGPT, gather_logits, padded_vocab_size, torch_tp, tp_bytes_per_step
from minigpt.parallel.tensor_parallel.kit import kit_for
from minigpt.parallel.tensor_parallel.model import replicated_digest, whole_state
from minigpt.runners import entry
from minigpt.train import TrainConfig, build_model, build_optimizer, lr_at, train_step

PROG = "lab/05_tensor_parallel.py"
DEFAULT_CHECK_STEPS = 150  # --check: the first 150 of the run's steps (--full: all of them)


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


def one_step(cfg: TrainConfig, dtype: torch.dtype, device: torch.device | str = "cpu") -> dict:
    """One forward and backward of MiniGPT on the first training batch, in one process and cut
    (TP, then TP with SP), on ``device``: logits, gradients, bytes, memory."""
    one = build_model(replace(cfg, dtype="float64" if dtype == torch.float64 else "float32")).to(device)
    x, y, mask = (
        t.to(device) for t in grammar.get_batch("train", 0, cfg.batch_size, seed=cfg.seed, block_size=cfg.block_size)
    )

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
        if not sp:
            ours_logits = gather_logits(local, cfg.model_config().vocab_size).detach()
    theirs = TorchTPSystem(replace(cfg, dtype="float64" if dtype == torch.float64 else "float32"), device)
    first = theirs.first_step()
    their_grads = first.grads
    out["pytorch"] = {
        "max_logit_diff": float((first.logits - logits.detach()).abs().max()),
        "max_logit_diff_from_ours": float((first.logits - ours_logits).abs().max()),
        "max_grad_diff": max(float((their_grads[k] - g).abs().max()) for k, g in grads.items()),
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
    (None without clipping). The batch goes where the model's parameters are."""
    device = next(model.parameters()).device
    x, y, mask = (
        t.to(device) for t in grammar.get_batch("train", step, cfg.batch_size, seed=cfg.seed, block_size=cfg.block_size)
    )
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


class TPSystem:
    """Our tensor-parallel MiniGPT as the proof harness sees it: every rank the whole batch, its slices
    of every layer (:class:`~minigpt.parallel.tensor_parallel.TPMiniGPT`), on ``device``."""

    def __init__(
        self,
        cfg: TrainConfig,
        sequence_parallel: bool,
        counter: ByteCounter | None = None,
        device: torch.device | str = "cpu",
    ):
        self.cfg, self.counter, self.device = cfg, counter, torch.device(device)
        self.model = cut(build_model(cfg).to(device), sequence_parallel, counter)
        self.optimizer = build_optimizer(self.model, cfg)
        self.seconds, self.sent = 0.0, []

    def train_step(self, step: int) -> tuple[float, torch.Tensor | None]:
        if self.counter is not None:
            self.counter.reset()
        t0 = time.perf_counter()
        loss, norm = tp_step(self.model, self.optimizer, step, self.cfg)
        self.seconds += time.perf_counter() - t0
        if self.counter is not None:
            self.sent.append(self.counter.sent)
        return loss, norm

    def whole_state(self) -> dict:
        return whole_state(self.model, self.optimizer)

    def first_step(self) -> proof.FirstStep:
        cfg = self.cfg
        batch = grammar.get_batch("train", 0, cfg.batch_size, seed=cfg.seed, block_size=cfg.block_size)
        local, loss = self.model(*(t.to(self.device) for t in batch))
        loss.backward()
        self.model.sync_sequence_parallel_grads(ByteCounter())
        logits = gather_logits(local, cfg.model_config().vocab_size).detach()
        return proof.FirstStep(slice(None), logits, self.model.full_state_dict(grads=True))


class TorchTPSystem:
    """PyTorch's own tensor parallelism on the same MiniGPT, cut as ours is
    (:mod:`~minigpt.parallel.tensor_parallel.torch_tp`: ``parallelize_module`` with Colwise/Rowwise on a
    split-qkv copy, the vocabulary cut and the loss under ``loss_parallel``), every rank the whole batch,
    on ``device`` (the mesh is of its type)."""

    def __init__(self, cfg: TrainConfig, device: torch.device | str = "cpu"):
        from torch.distributed.device_mesh import init_device_mesh

        self.cfg, self.device = cfg, torch.device(device)
        mesh = init_device_mesh(self.device.type, (dist.get_world_size(),), mesh_dim_names=("tp",))
        self.model = torch_tp.parallelize(torch_tp.split_qkv(build_model(cfg).to(device)), mesh, vocabulary=True)
        self.optimizer = build_optimizer(self.model, cfg)
        self.norm = proof.clip_capture(self.optimizer, lambda max_norm: torch_tp.clip_grad_norm_(self.model, max_norm))

    def train_step(self, step: int) -> tuple[float, torch.Tensor | None]:
        from torch.distributed.tensor.parallel import loss_parallel

        with loss_parallel():  # the loss on logits cut by vocabulary, forward and backward
            return train_step(self.model, self.optimizer, step, self.cfg), self.norm()

    def whole_state(self) -> dict:
        return torch_tp.whole_state(self.model, self.optimizer)

    def first_step(self) -> proof.FirstStep:
        from torch.distributed.tensor.parallel import loss_parallel

        cfg = self.cfg
        batch = grammar.get_batch("train", 0, cfg.batch_size, seed=cfg.seed, block_size=cfg.block_size)
        with loss_parallel():
            logits, loss = self.model(*(t.to(self.device) for t in batch))
            loss.backward()
        return proof.FirstStep(slice(None), proof.whole(logits), torch_tp.whole_gradients(self.model))


class SplitQKVControl:
    """The control: one process (every rank computes it whole) whose fused qkv is split into three
    ``Linear`` layers, nothing distributed. Its step drift against the fused twin is what reordering
    a few sums does over a run, with no tensor parallelism at all (on ``device``, where the twin is)."""

    def __init__(self, cfg: TrainConfig, device: torch.device | str = "cpu"):
        self.cfg = cfg
        self.model = torch_tp.split_qkv(build_model(cfg).to(device))
        self.optimizer = build_optimizer(self.model, cfg)
        self.norm = proof.run_norm_capture(self.model, self.optimizer)

    def train_step(self, step: int) -> tuple[float, torch.Tensor | None]:
        return train_step(self.model, self.optimizer, step, self.cfg), self.norm()

    def whole_state(self) -> dict:
        state = proof.plain_state(self.model, self.optimizer)
        state["weights"] = torch_tp.fused_names(state["weights"])
        state["moments"] = {k: torch_tp.fused_names(v) for k, v in state["moments"].items()}
        return state


def train(cfg: TrainConfig, args: argparse.Namespace, ctx: launch.DistContext, check: bool, steps: int) -> dict:
    """Train our TP for ``cfg.steps`` steps; with ``check``, the step drift at every step against one
    process (the twin clips with our norm), and PyTorch's TP and the split-qkv control trained the
    same way beside it (each against its own twin)."""
    from tqdm import tqdm

    counter = ByteCounter()
    system = TPSystem(cfg, args.sequence_parallel, counter, ctx.device)
    watch = Watch(system.model, cfg)
    bar = tqdm(
        total=steps,
        desc=f"[rank 0] train (tensor parallel {ctx.world_size}{' + SP' if args.sequence_parallel else ''}, {cfg.dtype})",
        disable=args.quiet or not ctx.is_main,
        dynamic_ncols=True,
        file=sys.stdout,
    )

    def on_step(step: int, loss: float, run: proof.DriftRun) -> None:
        watch.after_step(step, loss, system.model.named_parameters())
        bar.update(1)
        if ctx.is_main:
            shown = {"step drift": f"{run.drift.final:.1e}"} if check and run.drift.values else {}
            bar.set_postfix({"loss": f"{loss:.4f}", **shown})

    run = proof.run_with_twin(system, cfg, ctx, twin_norm="run", on_step=on_step, check=check, steps=steps)
    bar.close()
    bit_identical = True
    if check:
        digests = [None] * ctx.world_size
        dist.all_gather_object(digests, replicated_digest(system.model))
        bit_identical = len(set(digests)) == 1
    result = {
        "steps": steps,
        "schedule_steps": cfg.steps,
        "dtype": cfg.dtype,
        "final_loss": run.losses[-1],
        "seconds_per_step": system.seconds / steps,
        "bytes_sent_per_step": system.sent[-1],
        "step_drift": run.summary() if check else None,
        "replicated_bit_identical": bit_identical if check else None,
    }
    if check and cfg.dtype == "float32":
        launch.log(ctx, f"ours: step drift {run.drift.worst:.2e}; now PyTorch's TP on the same run")
        theirs = proof.run_with_twin(TorchTPSystem(cfg, ctx.device), cfg, ctx, twin_norm="run", steps=steps)
        result["pytorch_step_drift"] = theirs.summary()
        if args.full:
            launch.log(ctx, f"PyTorch's TP: step drift {theirs.drift.worst:.2e}; now the split-qkv control")
            control = proof.run_with_twin(SplitQKVControl(cfg, ctx.device), cfg, ctx, twin_norm="run", steps=steps)
            result["control_step_drift"] = control.summary()
    full = build_model(cfg)  # on the CPU: the tutor's scorer feeds the model CPU batches
    full.load_state_dict(system.model.full_state_dict())
    if cfg.dtype == "float32":
        result.update(entry.tutor_score(full, args, cfg.block_size, ctx))
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
    entry.add_check_flags(p, check_steps=DEFAULT_CHECK_STEPS)
    p.add_argument(
        "--test-sentences",
        type=cli.POSITIVE_INT,
        default=None,
        help="tutor accuracy on this many test sentences (default: all)",
    )
    entry.add_run_flags(p)
    cli.add_device_flag(p)
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
    return cfg


def measure(cfg: TrainConfig, args: argparse.Namespace, ctx: launch.DistContext) -> dict:
    t_start = time.perf_counter()
    tp = ctx.world_size
    trained = entry.steps_trained(args, cfg.steps)
    launch.log(
        ctx,
        f"MiniGPT {build_model(cfg).num_params():,} parameters | tensor parallel over {tp} ranks ({ctx.backend})"
        f"{', sequence parallel' if args.sequence_parallel else ''} | {trained} of {cfg.steps} steps | "
        f"implementation: {impl.current()}",
    )
    report: dict = {
        "world_size": ctx.world_size,
        "tp": tp,
        "dp": 1,
        "sequence_parallel": args.sequence_parallel,
        "implementation": impl.current(),
        "optimizer": cfg.optimizer,
        "lr": cfg.lr,
        "full": bool(args.full),
        "bytes_model": tp_bytes_per_step(cfg.batch_size, cfg.block_size, cfg.n_embd, cfg.n_layer, tp),
        "param_bytes_model": param_bytes_model(cfg, tp),
    }
    check = proof.Proof(proof.MODEL_PARALLEL, twin_norm="run", report=report)
    if args.check:
        report["one_step"] = {
            "float32": one_step(cfg, torch.float32, ctx.device),
            "float64": one_step(cfg, torch.float64, ctx.device),
        }
        f32 = report["one_step"]["float32"]
        report.update(
            fp32_first_step_logit_diff=max(f32["tp"]["max_logit_diff"], f32["sp"]["max_logit_diff"]),
            fp32_first_step_grad_diff=max(f32["tp"]["max_grad_diff"], f32["sp"]["max_grad_diff"]),
            pytorch_impl="torch.distributed.tensor.parallel.parallelize_module (ColwiseParallel, RowwiseParallel, "
            "the vocabulary cut too) with loss_parallel",
            pytorch_first_step_logit_diff=f32["pytorch"]["max_logit_diff_from_ours"],
        )
        check.float64(lambda c: TPSystem(c, args.sequence_parallel, device=ctx.device), cfg, ctx, args.fp64_steps)
        launch.log(
            ctx,
            f"one step: logits {report['fp32_first_step_logit_diff']:.1e}, gradients "
            f"{report['fp32_first_step_grad_diff']:.1e} from one process, logits {f32['pytorch']['max_logit_diff_from_ours']:.1e} "
            f"from PyTorch's TP | float64: step drift {report['fp64_max_step_drift']:.1e} over {report['fp64_steps']} "
            f"steps | bytes TP {f32['tp']['bytes_sent']:,}, SP {f32['sp']['bytes_sent']:,}, formula "
            f"{report['bytes_model']:,.0f}; now training",
        )
    report["training"] = train(cfg, args, ctx, args.check, trained)
    t = report["training"]
    report.update(tutor_accuracy=t["tutor_accuracy"], bytes_per_rank_per_step=t["bytes_sent_per_step"])
    if args.check:
        check.float32(t["step_drift"])
        report["replicated_bit_identical"] = t["replicated_bit_identical"]
        report["pytorch_fp32_max_step_drift"] = t["pytorch_step_drift"]["max"]
        if "control_step_drift" in t:
            report["control_fp32_max_step_drift"] = t["control_step_drift"]["max"]
        report.update(proof.against_pytorch([report]))
        report.update(verdict(report).keys())
    return entry.finish(report, args, ctx, summary, t_start)


def verdict(report: dict) -> proof.Verdict:
    """Lab 05's rulers: the harness's (the float32 drift over the run reported, not judged alone),
    PyTorch's TP on the same run, the bytes and the parameters per rank."""
    v = proof.Proof(proof.MODEL_PARALLEL, twin_norm="run", report=report).judge()
    one = report["one_step"]
    v.at_most(
        "fp64_first_step_grad_diff",
        max(one["float64"][m]["max_grad_diff"] for m in ("tp", "sp")),
        proof.FP64_DRIFT_BOUND,
        "float64, TP and SP",
    )
    v.at_most(
        "pytorch_first_step_logit_diff",
        report["pytorch_first_step_logit_diff"],
        proof.PYTORCH_ONE_STEP_BOUND,
        "our logits against parallelize_module's, one step",
    )
    if "pytorch_fp32_max_step_drift" in report:
        v.at_most(
            "fp32_max_step_drift_vs_pytorch",
            report["fp32_max_step_drift"],
            proof.drift_bound(report["pytorch_fp32_max_step_drift"]),
            f"within the course's {proof.FP32_DRIFT_BOUND:g}, or at most {proof.PYTORCH_DRIFT_FACTOR:g} x PyTorch's TP "
            f"on the same {report['fp32_steps']} steps ({report['pytorch_fp32_max_step_drift']:.2e})",
        )
    if "control_fp32_max_step_drift" in report:
        v.reported("control_fp32_max_step_drift", report["control_fp32_max_step_drift"], "one process, qkv split")
    v.equal("bytes_per_rank_per_step", report["bytes_per_rank_per_step"], report["bytes_model"], "theory 02's formula")
    for m in ("tp", "sp"):
        v.equal(f"one_step.{m}.bytes_sent", one["float32"][m]["bytes_sent"], report["bytes_model"], "float32")
        v.equal(f"one_step.{m}.bytes_sent_fp64", one["float64"][m]["bytes_sent"], 2 * report["bytes_model"], "float64")
    v.equal("param_bytes", one["float32"]["tp"]["param_bytes"], report["param_bytes_model"], "parameters per rank")
    v.true("replicated_bit_identical", report["replicated_bit_identical"], "the whole parameters on every rank")
    return v


def summary(report: dict) -> list[str]:
    t = report["training"]
    lines = [
        f"final: step {t['steps']} | loss {t['final_loss']:.4f} | tutor accuracy {100 * t['tutor_accuracy']:.1f}% "
        f"({t['tutor_correct']}/{t['tutor_total']}) | bytes per rank per step {report['bytes_per_rank_per_step']:,} "
        f"(formula {report['bytes_model']:,.0f})"
    ]
    if report.get("rulers"):
        one = report["one_step"]["float32"]
        lines.append(
            f"memory: parameters per rank {one['tp']['param_bytes']:,} B (model {report['param_bytes_model']:,}) | "
            f"saved activations: one process {one['one_process_saved_bytes']:,} B, TP "
            f"{one['tp']['saved_activation_bytes']:,}, SP {one['sp']['saved_activation_bytes']:,}"
        )
        lines += proof.Verdict.of(report).lines()
    return lines


LAB = entry.Lab(
    PROG,
    parse_args,
    check_args,
    measure,
    "minigpt.pages.lab05:render",
    ("training", "tp"),
    "lab/results/05-tensor-parallel-cpu.json",
)


def main(argv: list[str] | None = None) -> int:
    return entry.main(LAB, argv)
