"""Sharded state: what precision it travels in, how to take its norm, how to save it and read
it back at another world size. Each one measured against what one process computes.

Under FSDP no rank holds the whole model: parameters, gradients and optimizer states are
sharded (DTensors). Three things a user does with that state, on MiniGPT, on every rank of a
process group (normally 2 ranks, gloo on CPU):

* :func:`mixed_precision` - FSDP2 gathers the parameters in bf16 for compute and reduces the
  gradients in fp32 or in bf16; the error of each gradient against fp32, and how far the
  weights drift from an fp32 run.
* :func:`gradient_clipping` - clipping needs the norm of the *whole* gradient. A rank's own
  shard gives a smaller, rank-dependent norm; the true one needs the ranks' sums of squares
  added up (:func:`global_grad_norm_from_shards`). What clipping by the local norm does.
* :func:`save_checkpoints` / :func:`load_resharded` - a sharded checkpoint written with
  ``torch.distributed.checkpoint`` (DCP) by 2 ranks, read by a single process into a plain
  MiniGPT (resharding); the same logits. Against a full (gathered) state dict: the memory of
  rank 0 at save, and the files on disk.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import replace
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.fsdp import MixedPrecisionPolicy

from minigpt import checkpoints
from minigpt.fsdp.export import CONSOLIDATED_FILE
from minigpt.fsdp.memory import PeakMemory, local_tensor
from minigpt.fsdp.practice import (
    forward_backward,
    full_gradients,
    optimizer_step,
    probe_logits,
    sharded_model,
    step,
    unsharded,
)
from minigpt.parallel import equivalence
from minigpt.parallel.launch import DistContext
from minigpt.train import TrainConfig, build_model, build_optimizer


def one_process(ctx: DistContext) -> DistContext:
    """The same device, as a world of one: :func:`~minigpt.fsdp.practice.step` then trains the
    single-process reference on the whole global batch."""
    return DistContext(0, 0, 1, ctx.backend, ctx.device, ctx.timeout_s)


# ----------------------------------------------------------------------------------------------
# 1. Mixed precision

MIXED_PRECISION = {
    "fp32": None,
    "bf16 params, fp32 reduce": MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32),
    "bf16 params, bf16 reduce": MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16),
}


def relative_error(value: torch.Tensor, reference: torch.Tensor) -> float:
    """||value - reference|| / ||reference|| (2-norms)."""
    return float((value - reference).norm() / reference.norm())


def mixed_precision(cfg: TrainConfig, ctx: DistContext, steps: int = 10) -> dict:
    """Each variant of :data:`MIXED_PRECISION`, from the same weights as one fp32 process.

    The first step's gradient (unsharded, as fp32): ``grad_error``, its relative error against
    the one process's gradient; for the bf16 reduce, ``reduce_rounding``, its relative
    difference from the fp32-reduce gradient: the rounding of the reduction alone. Then after
    ``steps`` steps, max |logit difference| on the probe batch:

    * ``weight_drift`` - the variant's weights (its fp32 shards, gathered) read by an fp32
      model, against the one process: what training in bf16 did to the weights;
    * ``forward_drift`` - the variant's own forward (bf16 compute) against the same; before
      any step (``first_forward_drift``) that is the rounding of one bf16 forward alone;
    * ``vs_fsdp_fp32`` - the weight drift against the fp32 FSDP run instead.

    Which is larger, and why: the bf16 reduce's gradient error. Both variants compute forward
    and backward in bf16, which already makes the gradient wrong by a few tenths of a percent.
    The bf16 reduce then stores the sum in bf16: one more rounding (relative size about one
    bf16 unit roundoff, 2^-9), independent of the first, so the two add in quadrature. With N
    ranks a bf16 reduction may round its partial sums up to N - 1 times; an fp32 reduction
    rounds only to fp32. The weight drift after a few AdamW steps is another matter: it is
    dominated by the bf16 compute both share, and training is chaotic, so which of the two
    lands further from fp32 changes from seed to seed. (Buffers: FSDP2's policy has no dtype
    for them and leaves them as they are; MiniGPT's only buffers are its bool causal masks.)
    """
    probe = equivalence.probe_batch(block_size=cfg.block_size).to(ctx.device)
    reference = build_model(cfg).to(ctx.device)
    ref_opt = build_optimizer(reference, cfg)
    ref_first_logits = probe_logits(reference, probe)
    forward_backward(reference, 0, cfg, one_process(ctx))
    ref_grad = full_gradients(reference)
    optimizer_step(reference, ref_opt, 0, cfg)
    for s in range(1, steps):
        step(reference, ref_opt, s, cfg, one_process(ctx))
    ref_logits = probe_logits(reference, probe)
    reader = build_model(cfg).to(ctx.device)  # an fp32 model that reads a variant's weights
    results, weights, grads = {}, {}, {}
    for name, policy in MIXED_PRECISION.items():
        model, optimizer = sharded_model(cfg, ctx, "block", policy)
        first_forward = float((probe_logits(model, probe) - ref_first_logits).abs().max())
        forward_backward(model, 0, cfg, ctx)
        grads[name] = full_gradients(model)
        optimizer_step(model, optimizer, 0, cfg)
        for s in range(1, steps):
            step(model, optimizer, s, cfg, ctx)
        weights[name] = {k: unsharded(v) for k, v in model.state_dict().items()}
        reader.load_state_dict(weights[name])
        results[name] = {
            "grad_error": relative_error(grads[name], ref_grad),
            "first_forward_drift": first_forward,
            "weight_drift": float((probe_logits(reader, probe) - ref_logits).abs().max()),
            "forward_drift": float((probe_logits(model, probe) - ref_logits).abs().max()),
        }
    results["bf16 params, bf16 reduce"]["reduce_rounding"] = relative_error(
        grads["bf16 params, bf16 reduce"], grads["bf16 params, fp32 reduce"]
    )
    reader.load_state_dict(weights["fp32"])
    fsdp_fp32_logits = probe_logits(reader, probe)
    for name in MIXED_PRECISION:
        reader.load_state_dict(weights[name])
        results[name]["vs_fsdp_fp32"] = float((probe_logits(reader, probe) - fsdp_fp32_logits).abs().max())
    return {
        "steps": steps,
        "variants": results,
        "buffers": {n: str(b.dtype).removeprefix("torch.") for n, b in reference.named_buffers()},
    }


# ----------------------------------------------------------------------------------------------
# 2. Gradient clipping: the local norm against the global norm


def local_norm_term(tensors: Iterable[torch.Tensor], norm_type: float = 2.0) -> float:
    """This rank's share of a p-norm: the sum of |g|^p over its shards (the max for p = inf),
    in float64."""
    values = [local_tensor(t).detach().double().abs().flatten() for t in tensors]
    flat = torch.cat(values) if values else torch.zeros(0, dtype=torch.float64)
    if norm_type == float("inf"):
        return float(flat.max()) if flat.numel() else 0.0
    return float((flat**norm_type).sum())


def global_grad_norm_from_shards(local_terms: Sequence[float], norm_type: float = 2.0) -> float:
    """The norm of the whole gradient from each rank's :func:`local_norm_term`.

    The shards are disjoint (padding is zeros), so the whole gradient's sum of squares is the
    sum of the ranks' sums of squares: norm = (sum of terms)^(1/p); for p = inf, the largest
    term. A rank's own norm, term^(1/p), is smaller whenever another rank's shard is not zero.
    """
    if not local_terms:
        raise ValueError("need the term of at least one rank")
    if norm_type == float("inf"):
        return float(max(local_terms))
    if not norm_type > 0:
        raise ValueError(f"norm_type must be positive (or inf), got {norm_type}")
    return float(sum(local_terms)) ** (1.0 / norm_type)


def clip_by_local_norm(parameters: Iterable[torch.nn.Parameter], max_norm: float) -> float:
    """THE MISTAKE: scale this rank's gradient shards by a coefficient from their own norm.
    Returns the coefficient (each rank computes a different one)."""
    grads = [p.grad for p in parameters if p.grad is not None]
    coefficient = min(1.0, max_norm / (local_norm_term(grads) ** 0.5 + 1e-6))
    for g in grads:
        g.mul_(coefficient)
    return coefficient


def gradient_clipping(cfg: TrainConfig, ctx: DistContext, steps: int = 3) -> dict:
    """The norms of the first step's gradient, then ``steps`` clipped steps three ways.

    Norms: each rank's local norm; the global norm by :func:`global_grad_norm_from_shards` over
    the ranks' all-gathered terms; what ``clip_grad_norm_`` returns on the sharded gradients;
    the norm one process computes on its whole gradient. ``max_norm`` is half that last norm,
    so clipping really scales. Then, for SGD (lr 0.1) and AdamW, no warm-up: one process clips
    its gradient; FSDP clips by the global norm (``clip_grad_norm_``); FSDP clips each shard by
    its local norm. ``drift_per_step``: max |logit difference| of each FSDP run against the one
    process after each step.

    What goes wrong with the local norm: every local norm is smaller than the global one, so
    each rank scales its shard by a larger coefficient than one process would, and the ranks'
    coefficients differ: the step is not the clipped gradient's direction. SGD shows it at once.
    AdamW nearly hides it at its first step (it divides each element by that element's own
    size, so a scale cancels), then the moments remember different scales and the runs part.
    """
    probe = equivalence.probe_batch(block_size=cfg.block_size).to(ctx.device)
    reference = build_model(cfg).to(ctx.device)
    forward_backward(reference, 0, cfg, one_process(ctx))
    single = float(torch.nn.utils.get_total_norm([p.grad for p in reference.parameters()]))
    model, _ = sharded_model(cfg, ctx, "block")
    forward_backward(model, 0, cfg, ctx)
    terms: list[float | None] = [None] * ctx.world_size
    dist.all_gather_object(terms, local_norm_term(p.grad for p in model.parameters()))
    mine = global_grad_norm_from_shards(terms)
    torch_norm = float(unsharded(torch.nn.utils.clip_grad_norm_(model.parameters(), float("inf"))))
    max_norm = round(single / 2, 4)
    result = {
        "local_norms": [t**0.5 for t in terms],
        "global_norm": mine,
        "clip_grad_norm": torch_norm,
        "single_process_norm": single,
        "max_norm": max_norm,
        "local_coefficients": [min(1.0, max_norm / (t**0.5 + 1e-6)) for t in terms],
        "global_coefficient": min(1.0, max_norm / (mine + 1e-6)),
        "optimizers": {},
    }
    for optimizer_name in ("sgd", "adamw"):
        run_cfg = replace(
            cfg,
            optimizer=optimizer_name,
            grad_clip=max_norm,
            warmup=0,
            **({"lr": 0.1, "min_lr": 0.0} if optimizer_name == "sgd" else {}),
        )
        reference = build_model(run_cfg).to(ctx.device)
        ref_opt = build_optimizer(reference, run_cfg)
        runs = {how: sharded_model(run_cfg, ctx, "block") for how in ("global", "local")}
        drifts: dict[str, list[float]] = {how: [] for how in runs}
        for s in range(steps):
            step(reference, ref_opt, s, run_cfg, one_process(ctx))
            ref_logits = probe_logits(reference, probe)
            for how, (m, opt) in runs.items():
                forward_backward(m, s, run_cfg, ctx)
                if how == "local":
                    clip_by_local_norm(m.parameters(), max_norm)
                optimizer_step(m, opt, s, run_cfg if how == "global" else replace(run_cfg, grad_clip=0.0))
                drifts[how].append(float((probe_logits(m, probe) - ref_logits).abs().max()))
        result["optimizers"][optimizer_name] = {"lr": run_cfg.lr, "drift_per_step": drifts}
    return result


# ----------------------------------------------------------------------------------------------
# 3. Checkpoints: sharded (DCP) against full, and resharding on load

SHARDED_DIR = "sharded"  # the DCP folder: one file per rank and a .metadata index
FULL_FILE = "full.pt"  # the gathered state dict, written by rank 0
PROBE_FILE = "probe-logits.pt"  # the saving run's logits on the probe batch
LOAD_REPORT = "load-report.json"  # what the world-1 load measured, written beside the checkpoint
# the files a checkpoint folder may hold and still be replaced by a new save: the world-1 load's
# report and consolidated export (minigpt.fsdp.export), and the layout of a folder written before
# checkpoints had a completion marker
REPLACEABLE = (
    LOAD_REPORT,
    CONSOLIDATED_FILE,
    f"{SHARDED_DIR}/.metadata",
    f"{SHARDED_DIR}/__*_*.distcp",
    FULL_FILE,
    PROBE_FILE,
)


def disk_layout(path: Path) -> list[dict]:
    """The files of a checkpoint (a folder or one file), each with its size in bytes."""
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    return [{"file": str(p.relative_to(path.parent)), "bytes": p.stat().st_size} for p in files]


def save_checkpoints(cfg: TrainConfig, ctx: DistContext, out_dir: str | Path, steps: int = 3) -> dict:
    """Train a block-wrapped MiniGPT ``steps`` steps, then save it (model and AdamW state) twice:

    * sharded: ``get_state_dict`` (DTensors, this rank's shards, no copy) and ``dcp.save`` -
      every rank writes its own file, in parallel;
    * full: ``get_state_dict`` with ``StateDictOptions(full_state_dict=True, cpu_offload=True)``
      (every tensor gathered, kept on rank 0 only, on the CPU) and ``torch.save`` on rank 0.

    The peak of each save is measured on every rank. Rank 0 also writes the probe logits.

    ``out_dir`` is one checkpoint: ``sharded/``, ``full.pt``, ``probe-logits.pt`` and the
    completion marker ``complete.json`` (:mod:`minigpt.checkpoints`). Nothing is written into
    it: rank 0 makes a new folder beside it, every rank writes there, and when every file is
    written rank 0 seals it and swaps it in. A rank that dies mid-save leaves the previous
    checkpoint as it was, and an unfinished folder beside it that the next save removes.
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    out_dir = Path(out_dir)
    model, optimizer = sharded_model(cfg, ctx, "block")
    for s in range(steps):
        step(model, optimizer, s, cfg, ctx)
    logits = probe_logits(model, equivalence.probe_batch(block_size=cfg.block_size).to(ctx.device))
    new: list[str | None] = [None]
    if ctx.rank == 0:
        checkpoints.replaceable(out_dir, REPLACEABLE)
        new[0] = str(checkpoints.new_folder(out_dir))
        (Path(new[0]) / SHARDED_DIR).mkdir()
        torch.save(logits.cpu(), Path(new[0]) / PROBE_FILE)
    dist.broadcast_object_list(new, src=0)  # every rank writes into the folder rank 0 made
    tmp = Path(new[0])
    with PeakMemory(ctx.device) as sharded_save:
        model_sd, optim_sd = get_state_dict(model, optimizer)
        dcp.save({"model": model_sd, "optimizer": optim_sd}, checkpoint_id=tmp / SHARDED_DIR)
    del model_sd, optim_sd
    with PeakMemory(ctx.device) as full_save:
        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        model_sd, optim_sd = get_state_dict(model, optimizer, options=options)
        if ctx.rank == 0:
            torch.save({"model": model_sd, "optimizer": optim_sd}, tmp / FULL_FILE)
    del model_sd, optim_sd
    peaks: list[dict | None] = [None] * ctx.world_size
    dist.all_gather_object(peaks, {"sharded": sharded_save.peak_bytes, "full": full_save.peak_bytes})
    dist.barrier()  # every file is written (dcp.save returns after every rank wrote its file)
    if ctx.rank == 0:
        checkpoints.commit_folder(tmp, out_dir)
    dist.barrier()  # the new checkpoint is in place
    return {
        "world_size": ctx.world_size,
        "steps": steps,
        "save_peak_bytes_per_rank": peaks,
        "layout": {"sharded": disk_layout(out_dir / SHARDED_DIR), "full": disk_layout(out_dir / FULL_FILE)},
        "index": dcp_index(out_dir / SHARDED_DIR),
    }


def dcp_index(folder: Path) -> dict:
    """What a DCP ``.metadata`` records: the tensors by name, and each piece of each tensor
    (which rank's file, at which offset in the full tensor). Loading at any world size reads
    the pieces that overlap what each new rank holds. ``payload_bytes``: the tensor data."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    metadata = dcp.FileSystemReader(folder).read_metadata()
    tensors = {fqn: m for fqn, m in metadata.state_dict_metadata.items() if isinstance(m, TensorStorageMetadata)}
    pieces = [chunk for m in tensors.values() for chunk in m.chunks]
    payload = sum(math.prod(c.sizes) * m.properties.dtype.itemsize for m in tensors.values() for c in m.chunks)
    return {
        "tensors": len(tensors),
        "pieces": len(pieces),
        "payload_bytes": payload,
        "model_tensors": sorted(fqn.removeprefix("model.") for fqn in tensors if fqn.startswith("model.")),
    }


def _first_line(exc: BaseException) -> str:
    """``Type: the first sentence`` of an exception; for DCP's CheckpointException (which wraps
    what failed on each rank, traceback included), that of the first rank's error."""
    failures = getattr(exc, "failures", None)
    if isinstance(failures, dict) and failures:
        exc = next(iter(failures.values()))[0]
    text = str(exc).strip()
    first = text.splitlines()[0].split(". ")[0] if text else ""
    return f"{type(exc).__name__}: {first}".rstrip(": ")


def load_resharded(cfg: TrainConfig, out_dir: str | Path) -> dict:
    """In a world of one: read the sharded checkpoint into a plain (unsharded) MiniGPT and its
    AdamW, and compare with what the saving run wrote.

    The model starts from other weights (seed + 1) so that only the load can make it right.
    ``max_logit_difference``: against the saving run's probe logits; ``max_weight_difference``
    and ``max_optimizer_difference``: against the full state dict.

    Before anything is read the checkpoint is checked: the completion marker, every file it
    lists (size and SHA-256), the tensors of the DCP index and of ``full.pt`` against the model
    ``cfg`` describes, the probe logits' shape. Anything wrong is a ValueError of one line that
    names the file.
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    given = Path(out_dir)
    out_dir = checkpoints.recover(given)  # a save killed between its two renames is finished here
    if out_dir is None:
        raise ValueError(
            f"no checkpoint in {given}; save one first (the world-2 part: torchrun "
            f"--nproc_per_node=2 lab/03_fsdp_practice.py --only checkpoint --out-dir {given})"
        )
    checkpoints.check_folder(out_dir, required=(f"{SHARDED_DIR}/.metadata", FULL_FILE, PROBE_FILE))
    folder = out_dir / SHARDED_DIR
    model = build_model(replace(cfg, seed=cfg.seed + 1))
    optimizer = build_optimizer(model, cfg)
    model_sd, optim_sd = get_state_dict(model, optimizer)  # the shapes DCP fills in, unsharded
    try:
        metadata = dcp.FileSystemReader(folder).read_metadata()
    except (Exception, CheckpointException) as exc:  # noqa: BLE001 - one line that names the file
        raise ValueError(f"{folder / '.metadata'}: DCP cannot read it ({_first_line(exc)})") from None
    index = {
        k.removeprefix("model."): m
        for k, m in metadata.state_dict_metadata.items()
        if k.startswith("model.") and isinstance(m, TensorStorageMetadata)
    }
    checkpoints.check_tensors(
        f"{folder} (its index)",
        {k: _Described(m.size, m.properties.dtype) for k, m in index.items()},
        model_sd,
        model="the lab's MiniGPT",
    )
    state = {"model": model_sd, "optimizer": optim_sd}
    try:
        dcp.load(state, checkpoint_id=folder)
    except (Exception, CheckpointException) as exc:  # noqa: BLE001 - CheckpointException is a BaseException
        raise ValueError(f"{folder}: DCP cannot load it into MiniGPT and AdamW ({_first_line(exc)})") from None
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])
    logits = probe_logits(model, equivalence.probe_batch(block_size=cfg.block_size))
    saved_logits = _load(out_dir / PROBE_FILE)
    if not isinstance(saved_logits, torch.Tensor) or saved_logits.shape != logits.shape:
        raise ValueError(
            f"{out_dir / PROBE_FILE}: not the probe logits of this model (a tensor of shape {tuple(logits.shape)})"
        )
    full = _load(out_dir / FULL_FILE)
    if not (isinstance(full, dict) and isinstance(full.get("optimizer"), dict) and "state" in full["optimizer"]):
        raise ValueError(f"{out_dir / FULL_FILE}: not a full state dict (a dictionary of 'model' and 'optimizer')")
    weights = model.state_dict()
    checkpoints.check_tensors(f"{out_dir / FULL_FILE}: the model", full.get("model"), weights, "the lab's MiniGPT")
    loaded_optim = get_state_dict(model, optimizer)[1]["state"]
    for name, st in full["optimizer"]["state"].items():
        checkpoints.check_tensors(
            f"{out_dir / FULL_FILE}: the optimizer state of {name}", st, loaded_optim.get(name, {}), "AdamW"
        )
    return {
        "max_logit_difference": float((logits - saved_logits).abs().max()),
        "max_weight_difference": max(float((weights[k] - v).abs().max()) for k, v in full["model"].items()),
        "max_optimizer_difference": max(
            float((loaded_optim[name][k] - v).abs().max())
            for name, st in full["optimizer"]["state"].items()
            for k, v in st.items()
        ),
        "tensors_compared": len(full["model"]),
        "full_stores_tied_twice": (
            full["model"]["wte.weight"].untyped_storage().data_ptr()
            != full["model"]["lm_head.weight"].untyped_storage().data_ptr()
        ),
    }


class _Described:
    """A tensor known by its shape and dtype only (an entry of a DCP index)."""

    def __init__(self, shape, dtype) -> None:
        self.shape, self.dtype = tuple(shape), dtype


def _load(path: Path) -> object:
    """``torch.load`` of a file of the checkpoint, any failure one line naming it."""
    try:
        return torch.load(path, weights_only=False)
    except Exception as exc:  # noqa: BLE001
        raise ValueError(f"{path}: not readable by torch.load ({_first_line(exc)})") from None
