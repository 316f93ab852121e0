"""The FSDP options a real configuration meets first, measured on MiniGPT: what the optimizer sees
under FSDP1 (``use_orig_params`` False and True) and FSDP2, which dtype a matmul runs in when
autocast and FSDP's mixed precision are both set, and CPU offload.

* :func:`what_the_optimizer_sees`: FSDP1 with ``use_orig_params=False`` hands the optimizer one flat
  1-D parameter per unit (no original names, so no weight-decay groups by name, and a unit must be all
  trainable or all frozen); with ``True`` the original names come back, each a 1-D piece of this rank's
  shard, so a rule "decay the matrices" written as ``p.dim() >= 2`` (as ``minigpt.train`` does) decays
  nothing; FSDP2 keeps every parameter a DTensor of its own shape, cut by rows.
* :func:`autocast_precedence`: the dtypes of one Linear's input and output, the reduce-scatter's and the
  sharded gradient's, under each combination of ``MixedPrecisionPolicy`` and ``torch.autocast``.
* :func:`cpu_offload`: FSDP2's ``CPUOffloadPolicy`` tried here, and what it moves and saves per step.

Run by ``lab/03_fsdp_options.py``; Lab 03's page, "The options you meet first".
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

from minigpt.fsdp.practice import forward_backward, shard
from minigpt.model import Block
from minigpt.parallel import calls
from minigpt.parallel.launch import DistContext
from minigpt.train import TrainConfig, build_model, build_optimizer

FROZEN = "blocks.0.ln_1.weight"  # frozen in the unit of block 0, beside trainable parameters
PROBE = "blocks.0.attn.qkv"  # the first Linear: its dtypes are recorded
REDUCE_SCATTERS = ("reduce_scatter_tensor", "reduce_scatter_single")


def fsdp1(model: nn.Module, use_orig_params: bool, ctx: DistContext) -> nn.Module:
    """FSDP1: one unit per block, the rest in the root unit."""
    from torch.distributed.fsdp import FullyShardedDataParallel
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    return FullyShardedDataParallel(
        model, auto_wrap_policy=ModuleWrapPolicy({Block}), use_orig_params=use_orig_params, device_id=ctx.device
    )


WRAPPERS: dict[str, Callable[[nn.Module, DistContext], nn.Module]] = {
    "one process": lambda model, ctx: model,
    "FSDP1, use_orig_params=False": lambda model, ctx: fsdp1(model, False, ctx),
    "FSDP1, use_orig_params=True": lambda model, ctx: fsdp1(model, True, ctx),
    "FSDP2": lambda model, ctx: shard(model),
}


def _first_line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:160]}"


def what_the_optimizer_sees(cfg: TrainConfig, ctx: DistContext) -> list[dict]:
    """One row per wrapper: what ``named_parameters()`` gives on this rank, how many parameters
    ``minigpt.train.build_optimizer`` puts in its weight-decay group (it decays ``p.dim() >= 2``),
    AdamW's state after one step, and whether a unit may hold a frozen parameter."""
    rows = []
    for name, wrap in WRAPPERS.items():
        model = wrap(build_model(cfg).to(ctx.device), ctx)
        named = list(model.named_parameters())
        optimizer = build_optimizer(model, cfg)
        forward_backward(model, 0, cfg, ctx)
        optimizer.step()
        states = [s["exp_avg"] for s in optimizer.state.values()]
        try:
            frozen = build_model(cfg).to(ctx.device)
            frozen.get_parameter(FROZEN).requires_grad_(False)
            forward_backward(wrap(frozen, ctx), 0, cfg, ctx)
            frozen_in_unit = "ok"
        except (ValueError, RuntimeError, AssertionError) as exc:
            frozen_in_unit = _first_line(exc)
        rows.append(
            {
                "wrapper": name,
                "named_parameters": len(named),
                "first": [named[0][0], list(getattr(named[0][1], "to_local", lambda p=named[0][1]: p)().shape)],
                "first_type": type(named[0][1]).__name__,
                "decay_group": len(optimizer.param_groups[0]["params"]),
                "state_tensors": len(states),
                "state_type": type(states[0]).__name__ if states else "",
                "state_numel_here": sum(getattr(s, "to_local", lambda s=s: s)().numel() for s in states),
                "frozen_in_unit": frozen_in_unit,
            }
        )
    return rows


# a policy, or (the root's, the blocks'): each block's own fully_shard call takes the blocks' policy
CONFIGS: dict[str, tuple[MixedPrecisionPolicy | tuple | None, torch.dtype | None]] = {
    "fp32": (None, None),
    "policy bf16": (MixedPrecisionPolicy(param_dtype=torch.bfloat16), None),
    "policy bf16, reduce fp32": (MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32), None),
    "autocast bf16": (None, torch.bfloat16),
    "policy fp16 + autocast bf16": (MixedPrecisionPolicy(param_dtype=torch.float16), torch.bfloat16),
    # output_dtype: each block hands fp32 back, which the root's own LayerNorm and head need on CPU
    "root fp32, blocks bf16": (
        (MixedPrecisionPolicy(), MixedPrecisionPolicy(param_dtype=torch.bfloat16, output_dtype=torch.float32)),
        None,
    ),
}


def _short(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def autocast_precedence(cfg: TrainConfig, ctx: DistContext) -> list[dict]:
    """One forward and backward of FSDP2 MiniGPT per configuration: the probe Linear's input and output
    dtypes, the dtype FSDP reduce-scattered the gradients in, and the sharded gradient's dtype."""
    return [
        {"config": name, **_dtypes_under(policy, autocast, cfg, ctx)} for name, (policy, autocast) in CONFIGS.items()
    ]


def _dtypes_under(
    policy: MixedPrecisionPolicy | tuple | None, autocast: torch.dtype | None, cfg: TrainConfig, ctx: DistContext
) -> dict:
    if isinstance(policy, tuple):  # configuration layers: the more specific call wins for what it owns
        from minigpt.fsdp.variants import world_mesh

        model, (root, blocks) = build_model(cfg).to(ctx.device), policy
        mesh = world_mesh(ctx.device)
        for block in model.blocks:
            fully_shard(block, mesh=mesh, mp_policy=blocks)
        fully_shard(model, mesh=mesh, mp_policy=root)
    else:
        model = shard(build_model(cfg).to(ctx.device), mp_policy=policy)
    found: dict = {"error": ""}
    model.get_submodule(PROBE).register_forward_hook(
        lambda module, args, out: found.update(input=_short(args[0].dtype), output=_short(out.dtype))
    )
    reduced: set[str] = set()

    def note(name: str, args: tuple, kwargs: dict) -> None:
        reduced.update(_short(t.dtype) for t in calls.tensors(args, kwargs))

    try:
        with calls.intercepted(REDUCE_SCATTERS, note, nested=True):
            with torch.autocast(ctx.device.type, dtype=autocast, enabled=autocast is not None):
                forward_backward(model, 0, cfg, ctx)
    except RuntimeError as exc:  # a LayerNorm given autocast's dtype with weights in the policy's
        found["error"] = _first_line(exc)
    grad = model.get_submodule(PROBE).weight.grad
    return {**found, "reduce": ",".join(sorted(reduced)), "grad": _short(grad.dtype) if grad is not None else ""}


def cpu_offload(cfg: TrainConfig, ctx: DistContext) -> dict:
    """FSDP2's ``CPUOffloadPolicy`` tried on this rank's device, and its per-step traffic and savings
    per rank, for AdamW in fp32: the parameter shards go to the device before each all-gather and the
    gradient shards come back (4 bytes each way per local element); the device no longer holds the
    shards of the parameters, gradients and AdamW's two moments (16 bytes per local element)."""
    model = build_model(cfg).to(ctx.device)
    local = sum(-(-p.shape[0] // ctx.world_size) * (p.numel() // p.shape[0]) for p in model.parameters())
    try:
        fully_shard(model, offload_policy=CPUOffloadPolicy())
        forward_backward(model, 0, cfg, ctx)
        tried = "ran"
    except (RuntimeError, ValueError, AssertionError) as exc:
        tried = _first_line(exc)
    return {
        "tried": tried,
        "device": ctx.device.type,
        "local_elements": local,
        "bytes_to_device_per_step": 4 * local,
        "bytes_to_host_per_step": 4 * local,
        "device_bytes_saved": 16 * local,
    }


def checkpoint_cost(cfg: TrainConfig, ctx: DistContext, folder: Path, repeats: int = 5) -> dict:
    """The median seconds of a training step and of a sharded save of the whole training state
    (``dcp.save`` of the model's and AdamW's state dicts), and the checkpoint's bytes on disk: the two
    numbers Young's interval needs (:func:`minigpt.zero.memory.young_interval`)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model = shard(build_model(cfg).to(ctx.device))
    optimizer = build_optimizer(model, cfg)
    steps, saves = [], []
    for k in range(repeats + 1):
        dist.barrier()
        start = time.perf_counter()
        forward_backward(model, k, cfg, ctx)
        optimizer.step()
        optimizer.zero_grad()
        dist.barrier()
        if k:
            steps.append(time.perf_counter() - start)
    for k in range(repeats):
        model_state, optimizer_state = get_state_dict(model, optimizer)
        dist.barrier()
        start = time.perf_counter()
        dcp.save({"model": model_state, "optimizer": optimizer_state}, checkpoint_id=str(folder / f"save{k}"))
        dist.barrier()
        saves.append(time.perf_counter() - start)
    on_disk = sum(f.stat().st_size for f in (folder / "save0").rglob("*") if f.is_file())
    return {
        "step_seconds": statistics.median(steps),
        "save_seconds": statistics.median(saves),
        "checkpoint_bytes": on_disk,
    }


def safetensors_export(cfg: TrainConfig, ctx: DistContext, folder: Path) -> dict:
    """The sharded model consolidated on rank 0 and written as safetensors: the tied embedding refused
    by ``save_file`` (two names, one storage), written once by ``save_model``, read back into a new
    MiniGPT whose logits are compared with the sharded model's, bit for bit."""
    from safetensors import safe_open
    from safetensors.torch import load_model, save_file, save_model
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    from minigpt.fsdp.practice import rank_batch

    model = shard(build_model(cfg).to(ctx.device))
    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    probe = rank_batch(0, cfg, ctx)[0]
    with torch.no_grad():
        sharded_logits, _ = model(probe)
    found: dict = {}
    if ctx.rank == 0:
        plain = build_model(cfg)
        plain.load_state_dict(full)
        try:
            save_file(plain.state_dict(), str(folder / "refused.safetensors"))
            found["save_file"] = "ok"
        except (RuntimeError, ValueError) as exc:
            found["save_file"] = _first_line(exc)
        path = folder / "minigpt.safetensors"
        save_model(plain, str(path))
        with safe_open(str(path), framework="pt") as f:
            stored = list(f.keys())
        back = build_model(TrainConfig(seed=cfg.seed + 1))  # other weights, all overwritten
        missing, unexpected = load_model(back, str(path))
        with torch.no_grad():
            back_logits, _ = back(probe.cpu())
        found.update(
            {
                "file_bytes": path.stat().st_size,
                "stored_tensors": len(stored),
                "state_dict_names": len(plain.state_dict()),
                "tied_stored_as": [name for name in ("wte.weight", "lm_head.weight") if name in stored],
                "missing": list(missing),
                "unexpected": list(unexpected),
                "identical_logits": bool(torch.equal(back_logits, sharded_logits.cpu())),
            }
        )
    dist.barrier()
    return found
