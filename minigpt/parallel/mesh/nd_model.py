"""What Lab 07's model says each mesh dimension sends, and what each rank holds: the formulas of the
labs that taught each dimension, put together for the N-D mesh (:class:`~.nd.NDMesh`). The lab
(``lab/07_nd_parallel.py``) holds its measured bytes and memory against them on every rank; the lab
page uses the same functions to cost other frameworks' configurations."""

from __future__ import annotations

import torch

from minigpt.parallel.fsdp_by_hand.record import ring_sent_bytes
from minigpt.parallel.mesh.nd import NDMesh


def bytes_model_per_dim(cfg, mesh: NDMesh, unit_shapes: list[list[tuple]]) -> dict[str, int]:
    """One rank's bytes in one step, along each dimension, from the formulas of the labs that taught
    each (float32, ``accum`` = 1). ``cfg`` is a :class:`~minigpt.train.TrainConfig` (or anything with
    its ``batch_size``, ``block_size``, ``n_embd``, ``n_layer`` and ``n_head``); ``unit_shapes`` the
    TP-local parameter shapes of each FSDP unit, the root first:

    * ``tp``: theory page 02's tensor-parallel formula for this rank's rows and tokens
      (``B/dp`` rows of ``T/cp`` tokens), plus the clipping norm's one number;
    * ``cp``: ring attention's K and V round the ring, every layer, forward and backward, on
      this rank's ``H/tp`` heads;
    * ``dp_shard_cp``: Lab 02's unit-by-unit model of FSDP on the TP-local units (each tensor padded
      to a multiple of ``S = dp_shard x cp`` rows; the root gathered once, each block twice; one
      reduce-scatter per unit), plus the clipping norm's vector of one square per tensor;
    * ``dp_replicate``: the replicas' all-reduce of each unit's gradient shard, ``2 (R-1)/R`` of it.
    """
    from minigpt.parallel.mesh import hsdp as mh
    from minigpt.parallel.tensor_parallel.context_parallel import cp_bytes_per_step
    from minigpt.parallel.tensor_parallel.model import ring_all_reduce_bytes, tp_bytes_per_step
    from minigpt.zero import comm

    S, R = mesh.dp_shard * mesh.cp, mesh.dp_replicate
    rows, tokens = cfg.batch_size // mesh.dp, cfg.block_size // mesh.cp
    tp = tp_bytes_per_step(rows, tokens, cfg.n_embd, cfg.n_layer, mesh.tp) + ring_all_reduce_bytes(4, mesh.tp)
    cp = 0.0
    if mesh.cp > 1:
        head_dim = cfg.n_embd // cfg.n_head
        cp = cp_bytes_per_step(rows, cfg.n_head // mesh.tp, cfg.block_size, head_dim, cfg.n_layer, mesh.cp)
    padded = [sum(comm.padded(s[0], S) * (int(torch.Size(s).numel()) // s[0]) for s in unit) for unit in unit_shapes]
    per_dim = mh.hsdp_bytes_per_dim(padded, S, R, 4, 4, [False] + [True] * (len(padded) - 1))
    tensors = sum(len(unit) for unit in unit_shapes)
    norm = ring_sent_bytes("all-reduce", 4 * tensors, S) if S > 1 else 0
    return {
        "tp": round(tp),
        "cp": round(cp),
        "dp_shard_cp": per_dim["shard"] + norm,
        "dp_replicate": per_dim["replicate"],
    }


def model_states_model(mesh: NDMesh, unit_shapes: list[list[tuple]]) -> int:
    """The model states one rank holds after an optimizer step (float32, AdamW): its FSDP shard of
    every TP-local tensor (each padded to a multiple of ``dp_shard x cp`` rows, cut in equal shards),
    as weights (4 bytes an element), gradients (4) and AdamW's two moments (8), and AdamW's step
    counter, one float32 per tensor."""
    from minigpt.zero import comm

    n = mesh.dp_shard * mesh.cp
    elements = sum(comm.padded(s[0], n) * (int(torch.Size(s).numel()) // s[0]) for unit in unit_shapes for s in unit)
    return 16 * elements // n + 4 * sum(len(unit) for unit in unit_shapes)
