"""Lab 07, a second stated rule broken per exercise (tests/test_grader.py, SECOND_RULE_EACH):

* 7.1 - a dimension that is not one of the mesh's skipped instead of refused;
* 7.2 - a batch that does not split rounded down instead of refused (some rows never trained on);
* 7.3 - with one shard rank, its piece returned as it is: a view, so writing into the whole writes
  into a rank's piece.
"""

from __future__ import annotations

import torch

from minigpt.parallel.mesh.nd import DIMS, NDMesh, mesh_groups as _groups


def mesh_groups(degrees, dims):
    names = (dims,) if isinstance(dims, str) else tuple(dims)
    known = tuple(d for d in names if d in DIMS)  # "pp" quietly dropped
    return _groups(degrees, known or "tp")


def batch_plan(degrees, rank, batch_size, seq_len):
    mesh = NDMesh(**{d: degrees[d] for d in DIMS})
    per = batch_size // mesh.dp  # 10 rows over 4 ranks: 2 each, 2 rows never seen
    i = mesh.dp_index(rank)
    return range(i * per, (i + 1) * per), mesh.token_chunks(rank, seq_len)


def whole_parameter(pieces, rows, tp_dim, parts=1):
    if len(pieces[0]) == 1:
        slices = [by_shard[0][:rows] for by_shard in pieces]  # a view of the rank's piece
    else:
        slices = [torch.cat(list(by_shard), dim=0)[:rows] for by_shard in pieces]
    if tp_dim is None:
        return slices[0]
    blocks = [s.chunk(parts, dim=tp_dim) for s in slices]
    return torch.cat([b[i] for i in range(parts) for b in blocks], dim=tp_dim)
