"""Lab 07, one stated rule broken per exercise (tests/test_grader.py, ONE_RULE_EACH):

* 7.1 - flattened dimensions ordered as the caller named them, not in the mesh's order;
* 7.2 - each CP rank given two neighbouring chunks (c, c + 1 of its pair): the causal work unbalanced;
* 7.3 - the fused q, k, v weight joined as if it were one block (``parts`` ignored).
"""

from __future__ import annotations

import torch

from minigpt.parallel.mesh.nd import DIMS, batch_plan as _plan


def mesh_groups(degrees, dims):
    names = (dims,) if isinstance(dims, str) else tuple(dims)
    if any(d not in DIMS for d in names):
        raise ValueError(f"unknown mesh dimension in {dims!r}")
    shape = [degrees[d] for d in DIMS]
    world = 1
    for s in shape:
        world *= s
    groups: dict = {}
    for r in range(world):
        coords, rest = {}, r
        for name, size in zip(reversed(DIMS), reversed(shape)):
            rest, coords[name] = divmod(rest, size)
        key = tuple(coords[d] for d in DIMS if d not in names)
        groups.setdefault(key, []).append((tuple(coords[d] for d in names), r))  # the caller's order
    return sorted((tuple(r for _, r in sorted(m)) for m in groups.values()), key=min)


def batch_plan(degrees, rank, batch_size, seq_len):
    rows, (early, _) = _plan(degrees, rank, batch_size, seq_len)
    return rows, (2 * early, 2 * early + 1)  # two neighbours: the first CP rank gets the lightest work


def whole_parameter(pieces, rows, tp_dim, parts=1):
    slices = [torch.cat(list(by_shard), dim=0)[:rows] for by_shard in pieces]
    if tp_dim is None:
        return slices[0]
    return torch.cat(slices, dim=tp_dim)  # [q0 k0 v0 q1 k1 v1], not [q0 q1 k0 k1 v0 v1]
