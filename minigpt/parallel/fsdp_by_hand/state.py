"""The model's state out of the shards and back: a full state dict, and a sharded checkpoint that
loads at another world size.

* :func:`full_state_dict` - every parameter gathered whole (one all-gather per parameter, every
  rank calls it), under the model's usual ``state_dict()`` keys: what evaluation, the tutor and an
  export need. The tied matrix appears under both of its keys, as in one process.
* :func:`load_full_state_dict` - each rank keeps its rows of a full state dict.
* :func:`full_optimizer_state_dict` - the optimizer state gathered whole (AdamW's moments).
* :func:`save_sharded` / :func:`load_sharded` - each rank writes only its shards
  (``shard-<r>-of-<N>.pt``) and rank 0 a ``meta.json`` with every parameter's full shape, into a
  new folder swapped in only when complete (:mod:`minigpt.checkpoints`). Loading at M ranks reads
  the N shard files, puts each parameter's rows back together, drops the padding and cuts it
  again for M: a checkpoint saved on 2 ranks loads on 1 or 4.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from minigpt import checkpoints
from minigpt.parallel.fsdp_by_hand.marks import find_units

META = "meta.json"


def _keys_of_shards(model: nn.Module) -> dict[int, list[str]]:
    """id(shard) -> the ``state_dict()`` keys that hold it (two for the tied matrix)."""
    keys: dict[int, list[str]] = {}
    for key, value in model.state_dict(keep_vars=True).items():
        keys.setdefault(id(value), []).append(key)
    return keys


def _sharded_params(model: nn.Module):
    keys = _keys_of_shards(model)
    for unit in find_units(model):
        for p in unit.params:
            yield unit, p, keys[id(p.shard)]


@torch.no_grad()
def full_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The full ``state_dict`` (every rank gets it; call it on every rank, between steps)."""
    state = {k: v.detach() for k, v in model.state_dict(keep_vars=True).items()}
    for unit, p, keys in _sharded_params(model):
        full = unit.gather_rows(p.shard.detach(), p.rows, unit.group).reshape(p.shape).clone()
        for key in keys:
            state[key] = full
    return state


@torch.no_grad()
def load_full_state_dict(model: nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Copy this rank's rows of each full tensor of ``state`` into the shards."""
    for unit, p, keys in _sharded_params(model):
        full = state[keys[0]]
        if tuple(full.shape) != tuple(p.shape):
            raise ValueError(f"{keys[0]}: the state has shape {tuple(full.shape)}, the model {tuple(p.shape)}")
        p.shard.copy_(unit.shard_rows(full.to(p.shard.dtype), unit.rank, unit.world_size))


def save_sharded(model: nn.Module, path: str | Path, group: dist.ProcessGroup | None = None) -> None:
    """Write this rank's shards into the checkpoint folder ``path`` (every rank calls it)."""
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    tmp = [str(checkpoints.new_folder(path)) if rank == 0 else None]
    dist.broadcast_object_list(tmp, src=dist.get_global_rank(group, 0) if group else 0, group=group)
    folder = Path(tmp[0])
    shards, shapes = {}, {}
    for _, p, keys in _sharded_params(model):
        shards[keys[0]] = p.shard.detach().clone()
        shapes[keys[0]] = list(p.shape)
    torch.save(shards, folder / f"shard-{rank}-of-{world}.pt")
    if rank == 0:
        (folder / META).write_text(json.dumps({"world_size": world, "shapes": shapes}, indent=1))
    dist.barrier(group=group)
    if rank == 0:
        checkpoints.commit_folder(folder, path)
    dist.barrier(group=group)


@torch.no_grad()
def load_sharded(model: nn.Module, path: str | Path, group: dist.ProcessGroup | None = None) -> int:
    """Load a checkpoint of :func:`save_sharded`, saved at any world size, into this rank's shards;
    returns the world size it was saved at. CheckpointError (one line) when it is incomplete or
    does not fit the model."""
    path = Path(path)
    marker = checkpoints.check_folder(path, [META])
    meta = json.loads((path / META).read_text())
    saved_world = int(meta["world_size"])
    files = [path / f"shard-{r}-of-{saved_world}.pt" for r in range(saved_world)]
    missing = [f.name for f in files if f.name not in marker["files"]]
    if missing:
        raise checkpoints.CheckpointError(f"{path}: shard files missing: {', '.join(missing)}")
    pieces = [torch.load(f, map_location="cpu", weights_only=True) for f in files]
    for unit, p, keys in _sharded_params(model):
        key = keys[0]
        if key not in meta["shapes"] or meta["shapes"][key] != list(p.shape):
            saved = meta["shapes"].get(key)
            raise checkpoints.CheckpointError(
                f"{path}: {key} was saved with shape {saved}, the model has {list(p.shape)}"
            )
        full = torch.cat([piece[key] for piece in pieces])[: p.rows]
        p.shard.copy_(unit.shard_rows(full.to(p.shard.dtype), unit.rank, unit.world_size))
    return saved_world


@torch.no_grad()
def full_optimizer_state_dict(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """``optimizer.state_dict()`` with every per-parameter tensor of a shard's shape (AdamW's two
    moments) gathered whole: what the same optimizer over the unsharded model would hold, ready
    for its ``load_state_dict`` (every rank calls it). The step counters are copied as they are."""
    sharded = {id(p.shard): (unit, p) for unit in find_units(model) for p in unit.params}
    state = optimizer.state_dict()
    params = [p for group in optimizer.param_groups for p in group["params"]]
    full_state = {}
    for index, per_param in state["state"].items():
        if id(params[index]) not in sharded:  # a parameter its unit keeps whole (ignored_params)
            full_state[index] = {k: v.clone() if torch.is_tensor(v) else v for k, v in per_param.items()}
            continue
        unit, p = sharded[id(params[index])]
        full_state[index] = {
            k: unit.gather_rows(v, p.rows, unit.group).reshape(p.shape).clone()
            if torch.is_tensor(v) and v.shape == p.shard.shape
            else (v.clone() if torch.is_tensor(v) else v)
            for k, v in per_param.items()
        }
    return {"state": full_state, "param_groups": state["param_groups"]}


@torch.no_grad()
def whole_training_state(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """The weights and the optimizer's per-parameter state gathered whole, by parameter name:
    ``{"weights": ..., "moments": {key: {name: tensor}}, "step": tensor or None}``, the tied matrix
    named once (what the proof harness loads into one process; every rank calls it, after every
    step). One all-gather per unit and dtype, every rank's shards and moments end to end (Exercise
    4.4's rank-major layout): the bits of per-parameter all-gathers, without ~130 small collectives
    a step that each wait for four ranks to share two cores (lab page, section 3)."""
    keys = _keys_of_shards(model)
    owner = {id(p.shard): (unit, p) for unit in find_units(model) for p in unit.params}
    gathered = {key for shard in owner for key in keys[shard]}  # filled below (the full may be freed)
    weights = {k: v.detach().clone() for k, v in model.state_dict(keep_vars=True).items() if k not in gathered}
    state: dict = {"weights": weights, "moments": {}, "step": None}
    pieces: dict = {}  # (unit, dtype) -> [(keys, moment or None, param, tensor of its shard's shape)]
    for unit, p in owner.values():
        pieces.setdefault((unit, p.shard.dtype), []).append((keys[id(p.shard)], None, p, p.shard.detach()))
    for param in (p for group in optimizer.param_groups for p in group["params"]):
        for key, value in optimizer.state.get(param, {}).items():
            if key == "step":
                state["step"] = value.clone() if torch.is_tensor(value) else value
            elif id(param) not in owner:  # kept whole by its unit (ignored_params): as it is
                state["moments"].setdefault(key, {})[keys[id(param)][0]] = value.detach().clone()
            elif torch.is_tensor(value):
                unit, p = owner[id(param)]
                pieces.setdefault((unit, value.dtype), []).append((keys[id(param)], key, p, value.detach()))
    for (unit, _), group in pieces.items():
        flat = torch.cat([t.reshape(-1) for *_, t in group])
        out = flat.new_empty(unit.world_size * flat.numel())
        dist.all_gather_single(out, flat, group=unit.group)
        per_rank = out.view(unit.world_size, -1)  # row r: rank r's pieces, in the order above
        offset = 0
        for names, moment, p, t in group:
            rows = per_rank[:, offset : offset + t.numel()].reshape(unit.world_size * t.shape[0], *t.shape[1:])
            whole, offset = rows[: p.rows].reshape(p.shape).clone(), offset + t.numel()
            for key in names if moment is None else ():
                weights[key] = whole
            if moment is not None:
                state["moments"].setdefault(moment, {})[names[0]] = whole
    return state


@torch.no_grad()
def full_gradients(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter's gradient gathered whole after backward (its shard holds the reduced rows),
    by parameter name, the tied matrix under both of its keys (every rank calls it)."""
    grads = {}
    keys = _keys_of_shards(model)
    for unit in find_units(model):
        for _, p in unit.whole:  # kept whole: every rank holds the averaged gradient
            if p.grad is not None:
                for key in keys[id(p)]:
                    grads[key] = p.grad.detach().clone()
    for unit, p, keys in _sharded_params(model):
        if p.shard.grad is None:
            continue
        whole = unit.gather_rows(p.shard.grad.detach(), p.rows, unit.group).reshape(p.shape).clone()
        for key in keys:
            grads[key] = whole
    return grads
