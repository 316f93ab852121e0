"""Lab 07: the course's own mechanisms composed on one N-D mesh (:class:`~.nd.NDMesh`).

Nothing new is invented here; each dimension is run by the lab that taught it:

* ``tp`` - Lab 05's :class:`~minigpt.parallel.tensor_parallel.TPMiniGPT` on the tp group: every
  rank keeps its heads, its MLP columns and its vocabulary rows;
* ``cp`` - Lab 05's ring attention on the cp group, inside each TP rank's attention (its local
  heads), with the tokens cut load-balanced (``TPMiniGPT(..., cp_group=...)``);
* ``dp_shard`` (flattened with ``cp``) - Lab 04's ``fully_shard`` of every block and the root,
  on the TP-sliced parameters: a TP rank's slice is itself cut in rows over the shard group;
* ``dp_replicate`` - HSDP as Lab 06 measured it on FSDP2: after each unit's reduce-scatter, its
  gradient *shard* is all-reduced (averaged) over the replicas (:func:`with_replicas`).

**Why FSDP shards over ``dp_shard x cp``.** The ranks of a CP group hold the same weights (they
see the same rows, different tokens), so they may share one set of shards, as Accelerate's
``dp_shard_cp`` and torchtitan's ``dp_shard_cp`` meshes do. FSDP averages the gradients of its
group, but a CP rank's gradient is that of its *share* of each row's loss and the shares must be
*summed*: each CP rank's loss share is multiplied by ``cp`` (:class:`ShareTimesCP`), so that the
average over ``dp_shard x cp`` is the average over ``dp_shard`` of the whole rows' gradients.

**The norm for clipping** (:func:`nd_grad_norm`) adds what each dimension holds apart: each rank
takes its FSDP piece of every gradient, the squares are summed over the shard group (one vector,
one number per parameter: that gives each TP-local tensor's square), then the TP-cut tensors'
squares are summed over the tp group (one number) while the TP-whole ones (layer norms, position
embedding, row-parallel biases: the same on every TP rank) count once. The replicas already
hold the same gradient: they add nothing.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from minigpt.parallel.mesh.nd import DIMS, NDMesh
from minigpt.parallel.ring import ByteCounter
from minigpt.parallel.tensor_parallel import comm

SHARD_DIMS = ("dp_shard", "cp")  # FSDP's group: the two dimensions flattened


def groups_along(mesh: NDMesh, dims: str | tuple[str, ...]) -> list[tuple[int, ...]]:
    """The groups along ``dims`` from Exercise 7.1's ``mesh_groups`` (the reference's or the
    learner's, :func:`minigpt.impl.load`), refused with ValueError unless they cut the world into
    groups of the right size, each rank in one: a wrong group would otherwise hang a collective."""
    from minigpt import impl

    found = impl.load("lab07_nd_parallel", "mesh_groups")(mesh.degrees(), dims)
    names = (dims,) if isinstance(dims, str) else tuple(dims)
    size = 1
    for d in names:
        size *= mesh.degrees()[d]
    try:
        groups = [tuple(int(r) for r in g) for g in found]
    except TypeError:
        groups = []
    ranks = sorted(r for g in groups for r in g)
    if ranks != list(range(mesh.world_size)) or any(len(g) != size for g in groups):
        raise ValueError(
            f"mesh_groups({mesh.degrees()}, {dims!r}) returned {found!r}: the groups must hold every rank "
            f"0..{mesh.world_size - 1} once, {size} ranks each (Exercise 7.1)"
        )
    return groups


def build_groups(mesh: NDMesh, rank: int) -> dict[str, dist.ProcessGroup]:
    """This rank's process group along each dimension (``"tp"``, ``"cp"``, ``"dp_shard"``,
    ``"dp_replicate"``) and along FSDP's flattened ``"dp_shard_cp"``, from :func:`groups_along`. Every
    rank creates every group, in the same order (``dist.new_group`` is a collective over the whole
    world)."""
    mine: dict[str, dist.ProcessGroup] = {}
    for name, dims in [*((d, d) for d in reversed(DIMS)), ("dp_shard_cp", SHARD_DIMS)]:
        for members in groups_along(mesh, dims):
            group = dist.new_group(list(members))
            if rank in members:
                mine[name] = group
    return mine


class ShareTimesCP(nn.Module):
    """The model whose loss is this CP rank's share times ``cp`` (see the module's docstring);
    every other output as the model's."""

    def __init__(self, model: nn.Module, cp: int):
        super().__init__()
        self.model, self.cp = model, cp

    def forward(self, idx, targets=None, loss_mask=None):
        logits, loss = self.model(idx, targets, loss_mask)
        return logits, (None if loss is None else loss * self.cp)


def with_replicas(unit_class: type, group: dist.ProcessGroup, counter: ByteCounter) -> type:
    """``unit_class`` (Lab 04's unit, the reference's or the learner's) whose gradients are also
    averaged over the replicas: after the unit's own reduce-scatter over its shard group, its
    shards' gradients, end to end, go through Lab 01's ring all-reduce over ``group`` (bytes on
    ``counter``) and are divided by the number of replicas."""
    replicas = dist.get_world_size(group)

    def reduce_gradients(self) -> None:
        unit_class.reduce_gradients(self)
        grads = [p.shard.grad for p in self.params if p.shard.grad is not None]
        if not grads or replicas == 1:
            return
        flat = comm.all_reduce(torch.cat([g.reshape(-1) for g in grads]), group, counter) / replicas
        offset = 0
        for g in grads:
            g.copy_(flat[offset : offset + g.numel()].view_as(g))
            offset += g.numel()

    return type(f"Replicated{unit_class.__name__}", (unit_class,), {"reduce_gradients": reduce_gradients})


@torch.no_grad()
def nd_grad_norm(model: nn.Module, tp_cut: set[int], tp_group: dist.ProcessGroup, counter: ByteCounter) -> torch.Tensor:
    """The 2-norm of the whole model's gradient, the same on every rank. ``model`` is a TPMiniGPT
    made of Lab 04 units; ``tp_cut`` the ids of the units' shards whose TP-local tensor is a TP slice
    (the others are whole on every TP rank). The shard group's all-reduce is recorded by the unit
    (Lab 04's record); the tp group's one number goes on ``counter``."""
    from minigpt.parallel.fsdp_by_hand.gradients import local_norms
    from minigpt.parallel.fsdp_by_hand.marks import find_units

    shards = [p for p in model.parameters() if p.grad is not None]
    unit = find_units(model)[0]
    squares = torch.stack(local_norms(model)).pow(2)  # this rank's FSDP piece of each
    unit.record_collective("all-reduce", squares, is_async=False)
    dist.all_reduce(squares, op=dist.ReduceOp.SUM, group=unit.group)  # each TP-local tensor's square
    cut = torch.tensor([id(p) in tp_cut for p in shards], device=squares.device)
    tp_part = comm.all_reduce(squares[cut].sum().reshape(1), tp_group, counter)[0]
    return (tp_part + squares[~cut].sum()).sqrt()


def clip_grad_norm_(model: nn.Module, max_norm: float, tp_cut: set[int], tp_group, counter: ByteCounter):
    """Scale every gradient so that the whole model's norm is at most ``max_norm`` (as one process's
    ``clip_grad_norm_``); returns the norm."""
    norm = nd_grad_norm(model, tp_cut, tp_group, counter)
    scale = (max_norm / (norm + 1e-6)).clamp(max=1.0)
    for p in model.parameters():
        if p.grad is not None:
            p.grad.mul_(scale.to(p.grad.dtype))
    return norm


def whole_parameter(pieces: list[list[torch.Tensor]], rows: int, tp_dim: int | None, parts: int = 1) -> torch.Tensor:
    """Exercise 7.3's reference: one parameter whole again from every rank's FSDP piece of its TP slice.

    ``pieces[t][s]`` is the piece that rank ``s`` of the shard group holds of tensor-parallel rank
    ``t``'s slice: Lab 04's rows, the slice cut in equal row blocks along dimension 0 after padding it
    with zero rows to a multiple of the shard degree. ``rows`` is the slice's true row count.
    ``tp_dim`` says how tensor parallelism cut the parameter (:meth:`TPMiniGPT.tp_layout`): along
    dimension 0 or 1, or not at all (None: every TP rank's slice is the whole parameter); with
    ``parts`` > 1 (the fused q, k, v weight) each slice is ``parts`` blocks along ``tp_dim``, each cut
    over the TP ranks on its own, and the whole is every rank's first block, then every rank's second,
    and so on."""
    slices = [torch.cat(list(by_shard), dim=0)[:rows] for by_shard in pieces]  # FSDP's padding dropped
    if tp_dim is None:
        return slices[0]
    blocks = [s.chunk(parts, dim=tp_dim) for s in slices]
    return torch.cat([b[i] for i in range(parts) for b in blocks], dim=tp_dim)
