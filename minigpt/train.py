"""The single-process reference trainer: ``python -m minigpt.train``.

Every distributed run in the course is held against this loop. It is deterministic: the seed
fixes the initial weights, and the batches are a pure function of the step
(:func:`minigpt.grammar.get_batch`), so two runs with the same flags give bit-identical
parameters, and a run stopped and resumed from its checkpoint continues exactly as if it had
never stopped.

One optimizer step:

1. the global batch of ``batch_size`` sentences is cut into ``accum`` micro-batches;
2. each micro-batch's loss is divided by ``accum`` and back-propagated (gradients add up);
3. the gradient norm is clipped, the learning rate for this step is set (linear warm-up, then
   cosine decay to ``min_lr``), and the optimizer steps.

Because the loss of a batch is the mean of the losses of equal slices of it, the accumulated
gradient equals the gradient of the whole batch (up to rounding): accumulation, like data
parallelism, changes how the work is cut, not what is computed.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import sys
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import torch

from minigpt import checkpoints, cli, grammar
from minigpt.model import GPTConfig, MiniGPT

DEFAULT_CHECKPOINT = "out/minigpt.pt"
FORMAT = "minigpt-checkpoint-1"


@dataclass
class TrainConfig:
    steps: int = 450
    batch_size: int = 64
    accum: int = 1
    optimizer: str = "adamw"  # "adamw" or "sgd"
    lr: float = 3e-3
    min_lr: float = 3e-4
    warmup: int = 40
    weight_decay: float = 0.01
    momentum: float = 0.9  # SGD only
    grad_clip: float = 1.0  # 0 turns clipping off
    eval_every: int = 150  # 0 evaluates only at the end
    eval_sentences: int = 300  # sentences per intermediate evaluation (the final one uses all)
    seed: int = 0
    dtype: str = "float32"  # "float32" or "float64"
    # the model
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 96
    block_size: int = 32
    dropout: float = 0.0

    def model_config(self) -> GPTConfig:
        return GPTConfig(
            vocab_size=grammar.VOCAB_SIZE,
            block_size=self.block_size,
            n_layer=self.n_layer,
            n_head=self.n_head,
            n_embd=self.n_embd,
            dropout=self.dropout,
        )


OPTIMIZERS = ("adamw", "sgd")
DTYPES = {"float32": torch.float32, "float64": torch.float64}


# every field's rule, defined once: argparse's type= here and in the lab scripts, and validate()
RULES: dict[str, cli.Number] = {
    "steps": cli.POSITIVE_INT,
    "batch_size": cli.POSITIVE_INT,
    "accum": cli.POSITIVE_INT,
    "lr": cli.POSITIVE,
    "min_lr": cli.NON_NEGATIVE,
    "warmup": cli.NON_NEGATIVE_INT,
    "weight_decay": cli.NON_NEGATIVE,
    "momentum": cli.FRACTION,
    "grad_clip": cli.Number(float, low=0, note="0 turns clipping off"),
    "eval_every": cli.Number(int, low=0, note="0 evaluates only at the end"),
    "eval_sentences": cli.POSITIVE_INT,
    "seed": cli.SEED,
    "n_layer": cli.POSITIVE_INT,
    "n_head": cli.POSITIVE_INT,
    "n_embd": cli.POSITIVE_INT,
    "block_size": cli.POSITIVE_INT,
    "dropout": cli.FRACTION,
}


# every field's --help line, defined once: here and in the lab scripts (each adds its default)
HELP: dict[str, str] = {
    "steps": "optimizer steps; the learning-rate schedule spans them",
    "batch_size": "sentences per optimizer step (the global batch)",
    "accum": "micro-batches per step (gradient accumulation); must divide --batch-size",
    "optimizer": "adamw, or sgd with momentum",
    "lr": "peak learning rate, reached at the end of the warm-up",
    "min_lr": "learning rate at the end of the cosine decay",
    "warmup": "steps of linear warm-up up to --lr",
    "weight_decay": "the optimizer's weight decay",
    "momentum": "SGD's momentum (AdamW does not use it)",
    "grad_clip": "clip the gradient's global norm to this; 0 turns clipping off",
    "eval_every": "evaluate every this many steps; 0 evaluates only at the end",
    "eval_sentences": "sentences per intermediate evaluation (the final one uses all)",
    "seed": "seed of the initial weights and of every batch",
    "dtype": "precision of the weights and of the computation",
    "n_layer": "transformer blocks",
    "n_head": "attention heads per block",
    "n_embd": "width of the embeddings and of every block",
    "block_size": "longest sequence the model reads, in tokens",
    "dropout": "dropout probability",
}


def flag(name: str) -> str:
    """The command-line option of a TrainConfig field: ``batch_size`` -> ``--batch-size``."""
    return "--" + name.replace("_", "-")


def validate(cfg: TrainConfig) -> None:
    """Raise :class:`minigpt.cli.BadInput` (a ValueError) naming the first value that cannot
    work, and what would: each field by its rule (:data:`RULES`), then the fields together."""
    for name, rule in RULES.items():
        rule.check(flag(name), getattr(cfg, name))
    if cfg.optimizer not in OPTIMIZERS:
        raise cli.BadInput(f"--optimizer {cfg.optimizer}: unknown; choose from {', '.join(OPTIMIZERS)}")
    if cfg.dtype not in DTYPES:
        raise cli.BadInput(f"--dtype {cfg.dtype}: unknown; choose from {', '.join(DTYPES)}")
    if cfg.batch_size % cfg.accum:
        raise cli.BadInput(
            f"--batch-size {cfg.batch_size} is not divisible by --accum {cfg.accum}; "
            f"the batch is cut into {cfg.accum} equal micro-batches"
        )
    largest = torch.finfo(DTYPES[cfg.dtype]).max  # the optimizer adds lr into tensors of this dtype
    if cfg.lr > largest:
        raise cli.BadInput(
            f"--lr {cfg.lr:g}: too large for --dtype {cfg.dtype}, whose largest number is {largest:.3g}; "
            f"give a smaller learning rate (the default is 0.003)"
        )
    if cfg.min_lr > cfg.lr:
        raise cli.BadInput(f"--min-lr {cfg.min_lr:g}: above --lr {cfg.lr:g}; give a --min-lr in [0, {cfg.lr:g}]")
    if cfg.warmup >= cfg.steps:
        raise cli.BadInput(
            f"--warmup {cfg.warmup}: not less than --steps {cfg.steps}; give a warm-up in 0..{cfg.steps - 1}"
        )
    if cfg.n_embd % cfg.n_head:
        raise cli.BadInput(f"--n-embd {cfg.n_embd} is not divisible by --n-head {cfg.n_head}")
    if cfg.block_size < 18:
        raise cli.BadInput(
            f"--block-size {cfg.block_size}: too short; the longest example needs 18 tokens, give 18 or more"
        )


def lr_at(step: int, max_lr: float, min_lr: float, warmup: int, total: int) -> float:
    """Learning rate of optimizer step ``step`` (0-based): linear warm-up over ``warmup`` steps
    from max_lr/warmup to max_lr, then a half cosine from max_lr down to min_lr at ``total``."""
    if step < warmup:
        return max_lr * (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * min(progress, 1.0))) * (max_lr - min_lr)


def build_model(cfg: TrainConfig) -> MiniGPT:
    """The model of this config, initialised from ``cfg.seed`` (the same on every call)."""
    torch.manual_seed(cfg.seed)
    return MiniGPT(cfg.model_config()).to(DTYPES[cfg.dtype])


def build_optimizer(model: torch.nn.Module, cfg: TrainConfig) -> torch.optim.Optimizer:
    """AdamW with weight decay on matrices only (not on biases, norms), or SGD with momentum."""
    params = [p for p in model.parameters() if p.requires_grad]
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(params, lr=cfg.lr, momentum=cfg.momentum)
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(0.9, 0.95))


def train_step(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    step: int,
    cfg: TrainConfig,
    rank: int = 0,
    world_size: int = 1,
) -> float:
    """One optimizer step on this rank's slice of the global batch of ``step``.

    Returns the loss averaged over the micro-batches (this rank's share of the batch loss).
    With ``world_size == 1`` this is the whole single-process step; the labs call it with
    their own wrapped model and rank.
    """
    x, y, mask = grammar.get_batch(
        "train", step, cfg.batch_size, rank, world_size, seed=cfg.seed, block_size=cfg.block_size
    )
    device = next(model.parameters()).device
    x, y, mask = x.to(device), y.to(device), mask.to(device)
    micro = len(x) // cfg.accum
    if micro == 0:
        raise ValueError(f"this rank's {len(x)} rows cannot be cut into {cfg.accum} micro-batches")
    total = 0.0
    for i in range(cfg.accum):
        rows = slice(i * micro, (i + 1) * micro)
        # a data-parallel wrapper need not synchronise before the last micro-batch
        last = i == cfg.accum - 1
        with contextlib.nullcontext() if last or not hasattr(model, "no_sync") else model.no_sync():
            _, loss = model(x[rows], y[rows], mask[rows])
            (loss / cfg.accum).backward()
        total += loss.item() / cfg.accum
    if cfg.grad_clip > 0:
        # an optimizer that holds only a shard of the averaged gradient (Lab 02's ZeRO-1) knows
        # how to take the norm of the whole; otherwise every rank holds the whole gradient
        clip = getattr(optimizer, "clip_grad_norm_", None) or (
            lambda max_norm: torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        )
        clip(cfg.grad_clip)
    lr = lr_at(step, cfg.lr, cfg.min_lr, cfg.warmup, cfg.steps)
    for group in optimizer.param_groups:
        group["lr"] = lr
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return total


# ----------------------------------------------------------------------------------------------
# Checkpoints


def save_checkpoint(
    path: str | Path, model: MiniGPT, optimizer: torch.optim.Optimizer, step: int, cfg: TrainConfig
) -> None:
    """Write the checkpoint beside the old one and rename it into place
    (:func:`minigpt.checkpoints.write_file`): a save killed at any moment leaves the previous
    checkpoint whole, and its temporary file is removed by the next save.

    Two runs with the same flags write byte-identical files, and so does a run stopped and
    resumed. The only random state saved is torch's generator, which the run itself seeded
    (:func:`build_model`) and which dropout draws from; numpy's and Python's global generators
    are never drawn from here (the batches come from generators seeded by the step), and saving
    them stored the entropy each process starts with, which differs from run to run. The state
    is pickled through :func:`minigpt.checkpoints.canonical`, so its bytes depend on its content
    only, not on whether this process read a checkpoint before.
    """
    state = {
        "format": FORMAT,
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "step": step,  # optimizer steps done
        "train_config": asdict(cfg),
        "vocabulary": list(grammar.vocabulary()),
        "rng": {"torch": torch.get_rng_state()},
    }
    checkpoints.write_file(path, lambda f: torch.save(checkpoints.canonical(state), f))


def load_checkpoint(path: str | Path) -> dict:
    """Read a checkpoint written by :func:`save_checkpoint` and check that it is consistent
    before anything uses it: its format and keys, its training config (known keys, valid
    values, a dtype this trainer knows), the step, and every tensor of the model and the
    optimizer against the shapes and dtypes that config implies. ValueError (one line naming
    the file and what is wrong) otherwise."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"no checkpoint at {path}; train one with: python -m minigpt.train --out {path}")
    try:
        state = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as exc:  # noqa: BLE001 - any unreadable file gets the same clear message
        raise ValueError(f"{path} is not a readable MiniGPT checkpoint ({exc.__class__.__name__})") from exc
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise ValueError(f"{path} is not a MiniGPT checkpoint")
    missing = [k for k in ("model", "optimizer", "step", "train_config", "vocabulary") if k not in state]
    if missing:
        raise ValueError(f"{path}: the checkpoint has no {', '.join(map(repr, missing))}")
    if state["vocabulary"] != list(grammar.vocabulary()):
        raise ValueError(f"{path} was trained with a different vocabulary than this minigpt.grammar")
    cfg = _checked_config(path, state["train_config"])
    step = state["step"]
    if not isinstance(step, int) or isinstance(step, bool) or not 0 <= step <= cfg.steps:
        raise ValueError(f"{path}: its step {step!r} is not a step count in 0..{cfg.steps} (its --steps)")
    with torch.device("meta"):  # shapes and dtypes only: no memory, no initialisation cost
        model = MiniGPT(cfg.model_config()).to(DTYPES[cfg.dtype])
        optimizer = build_optimizer(model, cfg)
    checkpoints.check_tensors(f"{path}: the model", state["model"], model.state_dict())
    _check_optimizer(path, state["optimizer"], optimizer)
    rng = state.get("rng", {}).get("torch") if isinstance(state.get("rng"), dict) else None
    if not (isinstance(rng, torch.Tensor) and rng.dtype == torch.uint8 and rng.shape == torch.get_rng_state().shape):
        raise ValueError(f"{path}: its torch random state ('rng') is missing or not a generator state")
    return state


def _checked_config(path: Path, saved: object) -> TrainConfig:
    """The TrainConfig a checkpoint stores, if every key is known, present and of the right type,
    and the values are valid (:func:`validate`)."""
    if not isinstance(saved, dict):
        raise ValueError(f"{path}: its train_config is a {type(saved).__name__}, not a dictionary")
    defaults = TrainConfig()
    known = [f.name for f in fields(TrainConfig)]
    unknown = [k for k in saved if k not in known]
    if unknown:
        raise ValueError(f"{path}: unknown config key {unknown[0]!r} (this trainer knows {', '.join(known)})")
    missing = [k for k in known if k not in saved]
    if missing:
        raise ValueError(f"{path}: the config key {missing[0]!r} is missing")
    for name, value in saved.items():
        kind = type(getattr(defaults, name))
        if isinstance(value, bool) or not isinstance(value, (int, float) if kind is float else kind):
            raise ValueError(f"{path}: the config's {name} is {value!r}, not a {kind.__name__}")
    cfg = TrainConfig(**saved)
    try:
        validate(cfg)
    except ValueError as exc:
        raise ValueError(f"{path}: its config is not valid: {exc}") from None
    return cfg


def _check_optimizer(path: Path, saved: object, optimizer: torch.optim.Optimizer) -> None:
    """The optimizer state of a checkpoint against ``optimizer`` (built on the config's model):
    the same parameter groups, and every per-parameter tensor (moments, momentum) shaped like its
    parameter."""
    expected = optimizer.state_dict()
    where = f"{path}: the optimizer state"
    if not (isinstance(saved, dict) and isinstance(saved.get("state"), dict) and "param_groups" in saved):
        raise ValueError(f"{where} is not an optimizer state dict")
    groups = saved["param_groups"]
    if not isinstance(groups, list) or [g.get("params") if isinstance(g, dict) else None for g in groups] != [
        g["params"] for g in expected["param_groups"]
    ]:
        raise ValueError(f"{where} has other parameter groups than --optimizer {optimizer.__class__.__name__}")
    params = {
        i: p
        for g, eg in zip(optimizer.param_groups, expected["param_groups"])
        for i, p in zip(eg["params"], g["params"])
    }
    for index, per_param in saved["state"].items():
        if index not in params or not isinstance(per_param, dict):
            raise ValueError(f"{where} holds a state for parameter {index!r}, which the model does not have")
        for key, value in per_param.items():
            if key == "step" or not isinstance(value, torch.Tensor):
                continue
            if value.shape != params[index].shape or value.dtype != params[index].dtype:
                raise ValueError(
                    f"{where}: {key} of parameter {index} is {tuple(value.shape)} "
                    f"{str(value.dtype).removeprefix('torch.')}, its parameter "
                    f"{tuple(params[index].shape)} {str(params[index].dtype).removeprefix('torch.')}"
                )


def model_from_checkpoint(state: dict) -> MiniGPT:
    """The model of a checkpoint read by :func:`load_checkpoint` (which checked that it fits)."""
    cfg = TrainConfig(**state["train_config"])
    model = MiniGPT(cfg.model_config()).to(DTYPES[cfg.dtype])
    model.load_state_dict(state["model"])
    return model


# ----------------------------------------------------------------------------------------------
# The command line


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    defaults = TrainConfig()
    p = cli.ArgumentParser(
        prog="python -m minigpt.train",
        name="minigpt.train",
        description=__doc__.split("\n")[0],
        formatter_class=cli.HelpFormatter,
    )
    for f in fields(TrainConfig):
        kwargs = {
            "type": RULES.get(f.name, type(getattr(defaults, f.name))),
            "default": None,  # None: not given (a resumed run keeps its checkpoint's settings)
            "help": f"{HELP[f.name]} (default: {getattr(defaults, f.name)})",
        }
        if f.name == "optimizer":
            kwargs["choices"] = OPTIMIZERS
        if f.name == "dtype":
            kwargs["choices"] = tuple(DTYPES)
        p.add_argument(flag(f.name), **kwargs)
    p.add_argument(
        "--out",
        help=f"checkpoint written at every evaluation and at the end "
        f"(default: {DEFAULT_CHECKPOINT}, or the --resume checkpoint)",
    )
    p.add_argument(
        "--resume",
        metavar="CHECKPOINT",
        help="continue a run from its checkpoint, whose settings are reused (default: a new run)",
    )
    p.add_argument(
        "--stop-at",
        type=cli.POSITIVE_INT,
        metavar="STEP",
        help="stop after this many steps; the schedule still spans --steps (default: run all --steps)",
    )
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    return p.parse_args(argv)


def fail(message: str, prog: str = "minigpt.train") -> None:
    """Refuse bad input: one line ``prog: error: message``, exit status 2 (see :mod:`minigpt.cli`)."""
    raise SystemExit(cli.refuse(prog, message))


def missing_checkpoint(option: str, path: str) -> None:
    """Refuse a checkpoint option (``--resume``, the tutor's ``--checkpoint``) naming no file, before
    anything is read: :class:`minigpt.cli.BadInput` naming the option and the path."""
    if not Path(path).is_file():
        raise cli.BadInput(
            f"{option} {path}: no checkpoint at {path}; train one with: python -m minigpt.train --out {path}"
        )


def config_from_args(args: argparse.Namespace) -> tuple[TrainConfig, dict | None]:
    given = {f.name: getattr(args, f.name) for f in fields(TrainConfig) if getattr(args, f.name) is not None}
    if args.resume is None:
        return TrainConfig(**given), None
    missing_checkpoint("--resume", args.resume)
    state = load_checkpoint(args.resume)
    cfg = TrainConfig(**state["train_config"])
    for name, value in given.items():
        if name in ("eval_every", "eval_sentences"):  # they do not change the weights
            setattr(cfg, name, value)
        elif getattr(cfg, name) != value:
            raise ValueError(
                f"--{name.replace('_', '-')} {value} differs from the checkpoint's "
                f"{getattr(cfg, name)}; a resumed run keeps its settings (start a new run instead)"
            )
    return cfg, state


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    try:
        cfg, state = config_from_args(args)
        validate(cfg)
        if args.stop_at is not None and not 0 < args.stop_at <= cfg.steps:
            raise ValueError(f"--stop-at must be in 1..{cfg.steps} (--steps), got {args.stop_at}")
        start = 0 if state is None else state["step"]
        if args.stop_at is not None and args.stop_at <= start:
            raise ValueError(f"--stop-at {args.stop_at} is not after the checkpoint's step {start}")
        if state is not None and start >= cfg.steps:
            raise ValueError(f"{args.resume} has already finished its {cfg.steps} steps")
        args.out = args.out or args.resume or DEFAULT_CHECKPOINT
        cli.output_file(args.out, "--out")  # checked before training; its folder is made when it is written
    except ValueError as exc:
        fail(str(exc))
    from tqdm import tqdm  # after validation: bad input answers at once

    t0 = time.perf_counter()
    model = build_model(cfg)
    optimizer = build_optimizer(model, cfg)
    if state is not None:
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        torch.set_rng_state(state["rng"]["torch"])  # dropout's draws go on where they stopped
    end = args.stop_at or cfg.steps
    print(
        f"MiniGPT: {model.num_params():,} parameters | vocabulary {grammar.VOCAB_SIZE} | "
        f"{len(grammar.tokenized('train', cfg.block_size)[0]):,} training sentences | "
        f"{cfg.optimizer} lr {cfg.lr:g} | steps {start}->{end} of {cfg.steps} | seed {cfg.seed}"
    )
    model.train()
    from minigpt.divergence import Diverged, Watch

    watch = Watch(model, cfg, optimizer)  # nan or inf: the step, the value, the setting to look at
    bar = tqdm(range(start, end), desc="train", disable=args.quiet, dynamic_ncols=True, file=sys.stdout)
    for step in bar:
        loss = train_step(model, optimizer, step, cfg)
        try:
            watch.after_step(step, loss)
        except Diverged as exc:
            bar.close()
            raise SystemExit(cli.stop("minigpt.train", str(exc))) from None
        bar.set_postfix(loss=f"{loss:.4f}", lr=f"{lr_at(step, cfg.lr, cfg.min_lr, cfg.warmup, cfg.steps):.2e}")
        done = step + 1
        if cfg.eval_every and done % cfg.eval_every == 0 and done < cfg.steps:
            result = grammar.score(model, "val", cfg.eval_sentences, block_size=cfg.block_size)
            bar.write(
                f"step {done:5d} | train loss {loss:.4f} | val loss {result['loss']:.4f} | "
                f"val accuracy {result['accuracy']:.1%} ({result['total']} sentences)"
            )
            save_checkpoint(args.out, model, optimizer, done, cfg)
    bar.close()
    save_checkpoint(args.out, model, optimizer, end, cfg)
    if end < cfg.steps:
        print(f"stopped at step {end} of {cfg.steps}; continue with: python -m minigpt.train --resume {args.out}")
        return {"step": end}
    val_loss = grammar.split_loss(model, "val", block_size=cfg.block_size)  # the loss: no decoding needed
    test = grammar.score(model, "test", block_size=cfg.block_size)
    seconds = time.perf_counter() - t0
    print(
        f"final: step {end} | val loss {val_loss:.4f} | tutor accuracy {test['accuracy']:.1%} "
        f"({test['correct']}/{test['total']} held-out test sentences, exact match) | "
        f"{seconds:.1f} s | checkpoint {args.out}"
    )
    return {"val_loss": val_loss, "tutor_accuracy": test["accuracy"], "seconds": seconds}


if __name__ == "__main__":
    main()
