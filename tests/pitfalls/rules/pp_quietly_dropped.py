"""Exercise 7.1: "pp" quietly dropped."""

from __future__ import annotations

from minigpt.parallel.mesh.nd import DIMS, mesh_groups as _groups


def mesh_groups(degrees, dims):
    names = (dims,) if isinstance(dims, str) else tuple(dims)
    known = tuple(d for d in names if d in DIMS)  # "pp" quietly dropped
    return _groups(degrees, known or "tp")
