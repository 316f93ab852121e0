"""Exercise 7.2: 10 rows over 4 ranks rounded down."""

from __future__ import annotations

from minigpt.parallel.mesh.nd import DIMS, NDMesh


def batch_plan(degrees, rank, batch_size, seq_len):
    mesh = NDMesh(**{d: degrees[d] for d in DIMS})
    per = batch_size // mesh.dp  # 10 rows over 4 ranks: 2 each, 2 rows never seen
    i = mesh.dp_index(rank)
    return range(i * per, (i + 1) * per), mesh.token_chunks(rank, seq_len)
