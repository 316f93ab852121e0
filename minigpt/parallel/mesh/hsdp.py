"""HSDP with PyTorch's FSDP2 on a 2-D mesh, and the bytes each mesh dimension carries.

``fully_shard(module, mesh=mesh)`` with a 2-D mesh ``("replicate", "shard")`` is HSDP: every
parameter is cut along its first dimension (padded to a multiple of S) over the ``shard`` group,
and the ``replicate`` groups hold copies. What FSDP2 calls, read in the installed torch
(``torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py``, torch 2.13):

* per unit, before forward and again before backward (not for the root, kept gathered):
  ``dist.all_gather_single`` over the shard group, output = the unit's padded size;
* per unit, after backward: ``dist.reduce_scatter_single`` over the shard group, input = the
  unit's padded gradient, then (``foreach_reduce``, HSDP only) ``dist.all_reduce`` of the reduced
  shard (padded size / S) over the replicate group.

:class:`MeshCollectiveCounter` sees those ``torch.distributed`` calls for the duration of a ``with``
(:func:`minigpt.parallel.calls.intercepted`) and files each under the mesh dimension whose group it ran on;
:func:`bytes_sent_per_dim` turns the buffers into what a ring sends: (S-1)/S of an all-gather's
output or a reduce-scatter's input, 2(R-1)/R of an all-reduce's buffer.
"""

from __future__ import annotations

from contextlib import ExitStack
from fractions import Fraction

import torch
import torch.distributed as dist
from torch import nn

from minigpt.parallel import calls

# the torch.distributed functions FSDP2 uses (the older *_tensor names too) and what each one is
OPS = {
    "all_gather_single": "all-gather",
    "all_gather_into_tensor": "all-gather",
    "reduce_scatter_single": "reduce-scatter",
    "reduce_scatter_tensor": "reduce-scatter",
    "all_reduce": "all-reduce",
}


def group_ranks(group: dist.ProcessGroup | None) -> tuple[int, ...]:
    """The global ranks of ``group`` (None: the whole world)."""
    if group is None:
        return tuple(range(dist.get_world_size()))
    return tuple(dist.get_process_group_ranks(group))


class MeshCollectiveCounter:
    """Calls and bytes of FSDP2's collectives, by operation and by mesh dimension.

    ``dims`` maps a dimension's name to this rank's group along it (``{"shard":
    mesh.get_group("shard"), ...}``); a call on any other group is filed under ``"other"``.
    ``bytes[(op, dim)]`` adds the larger buffer of each call: the gathered output, the scattered
    input, the all-reduced tensor. A call made from inside a counted call is not counted again.
    """

    def __init__(self, dims: dict[str, dist.ProcessGroup]):
        self._dims = {group_ranks(g): name for name, g in dims.items()}
        self.calls: dict[tuple[str, str], int] = {}
        self.bytes: dict[tuple[str, str], int] = {}
        self._block = ExitStack()

    def dim_of(self, group: dist.ProcessGroup | None) -> str:
        return self._dims.get(group_ranks(group), "other")

    def _note(self, name: str, args: tuple, kwargs: dict) -> None:
        key = (OPS[name], self.dim_of(calls.group_of(args, kwargs)))
        self.calls[key] = self.calls.get(key, 0) + 1
        self.bytes[key] = self.bytes.get(key, 0) + calls.largest_bytes(args, kwargs)

    def __enter__(self) -> MeshCollectiveCounter:
        self._block.enter_context(calls.intercepted(OPS, self._note))
        return self

    def __exit__(self, *exc) -> None:
        self._block.close()

    def summary(self) -> dict[str, dict[str, int]]:
        """``{"op on dim": {"calls": n, "bytes": b}}``, e.g. ``"all-gather on shard"``."""
        return {f"{op} on {dim}": {"calls": n, "bytes": self.bytes[(op, dim)]} for (op, dim), n in self.calls.items()}


def ring_factor(op: str, n: int) -> Fraction:
    """What a ring sends per rank, as a fraction of the buffer: (n-1)/n, or 2(n-1)/n for an all-reduce."""
    return Fraction(2 * (n - 1) if op == "all-reduce" else n - 1, n)


def bytes_sent_per_dim(counter: MeshCollectiveCounter, sizes: dict[str, int]) -> dict[str, int]:
    """Bytes this rank sends along each dimension of ``sizes`` (its name -> its degree) for the
    counted calls, with the ring factors (exact fractions, rounded once at the end)."""
    sent = {dim: Fraction(0) for dim in sizes}
    for (op, dim), size in counter.bytes.items():
        if dim in sent:
            sent[dim] += ring_factor(op, sizes[dim]) * size
    return {dim: round(value) for dim, value in sent.items()}


def hsdp_shard(model: nn.Module, mesh) -> nn.Module:
    """``fully_shard`` every block of MiniGPT over the 2-D ``mesh`` (HSDP), then the root; in place."""
    from torch.distributed.fsdp import fully_shard

    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def fsdp2_local_elements(params: list[torch.Tensor], shard: int, index: int) -> int:
    """Elements of the parameters ``params`` that shard ``index`` of ``shard`` really holds, padding
    left out: FSDP2 cuts each parameter's rows like ``torch.chunk`` (chunks of ceil(rows / S)
    rows, the last ones shorter or empty). Its buffers are padded to a multiple of S; AdamW's
    moments, made with ``zeros_like`` of the local shard, are not."""
    total = 0
    for p in params:
        rows = p.shape[0]
        per_chunk = -(-rows // shard)
        local_rows = max(0, min(per_chunk, rows - index * per_chunk))
        total += local_rows * (p.numel() // rows)
    return total


def hsdp_bytes_per_dim(
    unit_sizes: list[int],
    shard: int,
    replicate: int,
    param_bytes: int = 4,
    grad_bytes: int = 4,
    reshard_after_forward: list[bool] | None = None,
) -> dict[str, int]:
    """Bytes one rank sends in one HSDP step along each mesh dimension, by Lab 02's model, unit by
    unit: ``unit_sizes`` are the units' padded element counts (multiples of ``shard``). In the shard
    group each unit is all-gathered (twice when ``reshard_after_forward``: before forward and again
    before backward) and its gradient reduce-scattered, (S-1)/S of the buffer each; across the
    replicas the reduced shard, size / S, is all-reduced, 2(R-1)/R of it."""
    from minigpt.zero import comm

    collectives = comm.unit_collectives(
        unit_sizes, 3, shard, param_bytes, grad_bytes, reshard_after_forward, pad=False, replicas=replicate
    )
    return {
        "shard": round(sum(c.bytes_sent for c in collectives if c.group != "replica")),
        "replicate": round(sum(c.bytes_sent for c in collectives if c.group == "replica")),
    }
