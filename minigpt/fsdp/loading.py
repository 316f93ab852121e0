"""Loading a full checkpoint into FSDP shards, without any rank building the whole model first.

The plain way to start an FSDP run from a full checkpoint (one file: every weight, unsharded)
is to build the model on every rank, load the file into it, then ``fully_shard`` it: for a
moment every rank holds the whole model, the very thing FSDP is there to avoid. The FSDP-first
way, which :func:`fsdp_first_loading` measures on MiniGPT (every rank of a process group):

1. build the model on the ``meta`` device: its parameters have shapes and dtypes, no storage;
2. ``fully_shard`` it: the parameters become DTensors whose local shards are still on ``meta``;
3. ``to_empty(device=...)``: allocate this rank's shards only, uninitialised;
4. ``set_model_state_dict`` with ``StateDictOptions(full_state_dict=True)``: each rank copies
   its own slice of every full tensor into its shard.

Buffers that are not saved (``persistent=False``: MiniGPT's causal masks) are in no checkpoint;
``to_empty`` leaves them uninitialised, so they are computed again (:func:`rebuild_masks`).

With ``broadcast_from_rank0=True`` (:func:`cpu_ram_efficient_loading`) only rank 0 reads the
file; the other ranks pass an empty state dict and receive their slices from rank 0, tensor by
tensor: on a machine of 8 ranks, the file is in memory once, not 8 times.

Every function here returns the measured numbers: bytes of parameters each rank held before and
after the load, the bytes of checkpoint each rank read, the peak each rank allocated while
loading, and the largest difference between the loaded shards (gathered) and the checkpoint.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

from minigpt.fsdp.memory import PeakMemory, local_tensor
from minigpt.fsdp.practice import shard, unsharded
from minigpt.model import MiniGPT, causal_mask
from minigpt.parallel.launch import DistContext
from minigpt.train import TrainConfig, build_model


def parameter_bytes(model: nn.Module) -> int:
    """Bytes of parameters this rank really holds: a parameter on ``meta`` holds none, a DTensor
    holds its local shard (padding included), a plain tensor all of itself."""
    total = 0
    for p in model.parameters():
        t = local_tensor(p)
        if t.device.type != "meta":
            total += t.untyped_storage().nbytes()
    return total


def state_dict_bytes(state: dict) -> int:
    """Bytes of the tensors of a state dict (a storage shared by two names counted once)."""
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in state.values()}
    return sum(storages.values())


def rebuild_masks(model: MiniGPT) -> int:
    """Compute the causal masks again (non-persistent buffers: in no checkpoint); how many."""
    n = 0
    for name, buffer in model.named_buffers():
        if name.endswith("mask"):
            buffer.copy_(causal_mask(model.config.block_size).to(buffer.device))
            n += 1
    return n


def meta_sharded_model(cfg: TrainConfig, device: torch.device) -> tuple[MiniGPT, dict]:
    """Steps 1-3: a block-wrapped MiniGPT built on ``meta``, sharded, its shards allocated on
    ``device``; and the parameter bytes this rank held after each step."""
    with torch.device("meta"):
        model = MiniGPT(cfg.model_config())
    held = {"built on meta": parameter_bytes(model)}
    shard(model, "block", device=torch.device(device))
    held["sharded on meta"] = parameter_bytes(model)
    model.to_empty(device=device)
    rebuild_masks(model)
    held["to_empty"] = parameter_bytes(model)
    return model, held


def max_difference(model: nn.Module, state: dict) -> float:
    """max |loaded - checkpoint| over every tensor of the checkpoint (the shards gathered: a
    collective)."""
    loaded = model.state_dict()
    return max(float((unsharded(loaded[k]).cpu() - v).abs().max()) for k, v in state.items())


def write_full_checkpoint(cfg: TrainConfig, path: Path) -> int:
    """The full checkpoint the loading demonstrations read: a plain MiniGPT's state dict (from
    ``cfg.seed + 1``, so that nothing else could give the same weights), ``torch.save``'d."""
    model = build_model(replace(cfg, seed=cfg.seed + 1))
    torch.save(model.state_dict(), path)
    return path.stat().st_size


def _load(cfg: TrainConfig, ctx: DistContext, path: Path, reads: bool, broadcast: bool) -> dict:
    """Steps 1-4, this rank reading ``path`` (or not), and the measurements, gathered per rank."""
    with PeakMemory(ctx.device) as mem:
        model, held = meta_sharded_model(cfg, ctx.device)
        state = torch.load(path, weights_only=True) if reads else {}
        read = state_dict_bytes(state)
        options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=broadcast)
        set_model_state_dict(model, state, options=options)
        held["loaded"] = parameter_bytes(model)
    del state
    reference = torch.load(path, weights_only=True)  # after the measured region: to compare with
    difference = max_difference(model, reference)
    mine = {"held_bytes": held, "read_bytes": read, "load_peak_bytes": mem.peak_bytes}
    per_rank: list[dict | None] = [None] * ctx.world_size
    dist.all_gather_object(per_rank, mine)
    return {
        "full_bytes": state_dict_bytes(reference),
        "tensors": len(reference),
        "max_difference": difference,
        "per_rank": per_rank,
    }


def fsdp_first_loading(cfg: TrainConfig, ctx: DistContext, path: Path) -> dict:
    """Every rank reads the full checkpoint ``path`` and copies its own slices into its shards."""
    return _load(cfg, ctx, path, reads=True, broadcast=False)


def cpu_ram_efficient_loading(cfg: TrainConfig, ctx: DistContext, path: Path) -> dict:
    """Only rank 0 reads ``path``; every other rank passes ``{}`` and receives its slices."""
    return _load(cfg, ctx, path, reads=ctx.rank == 0, broadcast=True)
