"""Lab 07 pitfalls: three classic mistakes, each to be caught by exactly its own tests.

* the mesh laid out in the reverse order, tp outermost: a TP group becomes ranks 0 and 4, across
  the nodes, and every other dimension's groups move with it - 7.1;
* the data-parallel index counted over every rank: the ranks of a TP group get different rows,
  so their all-reduces add up pieces of different sentences - 7.2;
* FSDP's padding rows kept: the whole parameter grows a row or two of zeros - 7.3.
"""

from __future__ import annotations

import torch

from minigpt.parallel.mesh.nd import DIMS, batch_plan as _plan


def mesh_groups(degrees, dims):
    order = tuple(reversed(DIMS))  # tp outermost: the ranks of a TP group far apart
    names = (dims,) if isinstance(dims, str) else tuple(dims)
    if any(d not in DIMS for d in names):
        raise ValueError(f"unknown mesh dimension in {dims!r}")
    shape = [degrees[d] for d in order]
    world = 1
    for s in shape:
        world *= s
    groups: dict = {}
    for r in range(world):
        coords, rest = {}, r
        for name, size in zip(reversed(order), reversed(shape)):
            rest, coords[name] = divmod(rest, size)
        key = tuple(coords[d] for d in order if d not in names)
        groups.setdefault(key, []).append((tuple(coords[d] for d in order if d in names), r))
    return sorted((tuple(r for _, r in sorted(m)) for m in groups.values()), key=min)


def batch_plan(degrees, rank, batch_size, seq_len):
    _, chunks = _plan(degrees, rank, batch_size, seq_len)
    world = 1
    for d in DIMS:
        world *= degrees[d]
    dp = degrees["dp_replicate"] * degrees["dp_shard"]
    if batch_size % dp:
        raise ValueError(f"the batch of {batch_size} rows does not split into {dp} slices")
    per = batch_size // dp
    i = rank % dp  # every rank its own slice, as in plain DDP: TP and CP ranks see different rows
    return range(i * per, (i + 1) * per), chunks


def whole_parameter(pieces, rows, tp_dim, parts=1):
    slices = [torch.cat(list(by_shard), dim=0) for by_shard in pieces]  # the padding rows kept
    if tp_dim is None:
        return slices[0]
    blocks = [s.chunk(parts, dim=tp_dim) for s in slices]
    return torch.cat([b[i] for i in range(parts) for b in blocks], dim=tp_dim)
