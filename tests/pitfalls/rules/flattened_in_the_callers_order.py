"""Exercise 7.1: Flattened in the caller's order."""

from __future__ import annotations

from minigpt.parallel.mesh.nd import DIMS


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
