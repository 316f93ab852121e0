"""Lab 07's mesh: four dimensions at once, as coordinates, groups, degrees and a batch plan.

A world of W ranks is laid out as a 4-D grid with dimensions, from the outermost to the innermost,
``("dp_replicate", "dp_shard", "cp", "tp")`` - Accelerate's canonical order (``ParallelismConfig``)
and torchtitan's without its pipeline dimension. A rank's coordinates are its row-major index in
that grid, so the **innermost dimension varies fastest**: the ranks of a tensor-parallel group are
consecutive. Consecutive ranks share a node (torchrun numbers a node's ranks together), so the
dimension that talks the most - TP, an all-reduce in every layer, forward and backward - stays on
the node's fast links; then CP (ring attention's keys and values in every layer), then the shard
dimension (FSDP's all-gathers and reduce-scatters, once per unit), and outermost the replicas, which
only all-reduce a gradient shard once per step and can cross the slow links between nodes.

With 8 ranks and degrees ``dp_replicate=2, dp_shard=2, cp=1, tp=2``::

    rank:          0  1  2  3  4  5  6  7
    dp_replicate:  0  0  0  0  1  1  1  1
    dp_shard:      0  0  1  1  0  0  1  1
    cp:            0  0  0  0  0  0  0  0
    tp:            0  1  0  1  0  1  0  1

    tp groups:            (0, 1) (2, 3) (4, 5) (6, 7)
    dp_shard groups:      (0, 2) (1, 3) (4, 6) (5, 7)
    dp_replicate groups:  (0, 4) (1, 5) (2, 6) (3, 7)

A group of a dimension is the ranks whose other coordinates are all equal. Several dimensions can be
*flattened* into one group: FSDP shards over ``("dp_shard", "cp")`` (Accelerate's ``dp_shard_cp``),
because the ranks of a CP group hold the same weights and must sum their gradients anyway.

Only the data-parallel ranks (``dp_replicate x dp_shard`` of them) see different rows of the batch;
the ranks of a CP group see the same rows but different tokens, and those of a TP group the same
rows and the same tokens (:meth:`NDMesh.batch_rows`). Nothing here touches ``torch.distributed``:
the degrees are checked (:func:`check_degrees`) before any process group exists.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import prod

DIMS: tuple[str, ...] = ("dp_replicate", "dp_shard", "cp", "tp")


def _positive(name: str, value) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name} {value!r} is not a positive integer")


def _dims(dims: str | tuple[str, ...]) -> tuple[str, ...]:
    names = (dims,) if isinstance(dims, str) else tuple(dims)
    unknown = [d for d in names if d not in DIMS]
    if unknown or not names or len(set(names)) != len(names):
        raise ValueError(f"mesh dimensions {names!r}: each must be one of {', '.join(DIMS)}, once")
    return tuple(d for d in DIMS if d in names)  # the mesh's own order, outermost first


@dataclass(frozen=True)
class NDMesh:
    """The degrees of the four dimensions; the ranks' coordinates and groups follow from them."""

    dp_replicate: int = 1
    dp_shard: int = 1
    cp: int = 1
    tp: int = 1

    def __post_init__(self) -> None:
        for name in DIMS:
            _positive(name, getattr(self, name))

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(getattr(self, d) for d in DIMS)

    @property
    def world_size(self) -> int:
        return prod(self.shape)

    @property
    def dp(self) -> int:
        """The data-parallel ranks: how many different slices of the batch a step sees."""
        return self.dp_replicate * self.dp_shard

    def degrees(self) -> dict[str, int]:
        return dict(zip(DIMS, self.shape))

    def coords(self, rank: int) -> dict[str, int]:
        """``rank``'s coordinates, row-major (the last dimension, tp, varies fastest)."""
        if not isinstance(rank, int) or not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank!r} is outside this mesh's 0..{self.world_size - 1}")
        out: dict[str, int] = {}
        for name, size in zip(reversed(DIMS), reversed(self.shape)):
            rank, out[name] = divmod(rank, size)
        return {d: out[d] for d in DIMS}

    def rank(self, coords: dict[str, int]) -> int:
        """The rank at ``coords`` (every dimension given, each inside its degree)."""
        if set(coords) != set(DIMS):
            raise ValueError(f"coordinates {coords!r}: give each of {', '.join(DIMS)}")
        r = 0
        for name, size in zip(DIMS, self.shape):
            c = coords[name]
            if not isinstance(c, int) or not 0 <= c < size:
                raise ValueError(f"{name} coordinate {c!r} is outside 0..{size - 1}")
            r = r * size + c
        return r

    def groups(self, dims: str | tuple[str, ...]) -> list[tuple[int, ...]]:
        """The groups along ``dims`` (:func:`mesh_groups`)."""
        return mesh_groups(self.degrees(), dims)

    def group_of(self, rank: int, dims: str | tuple[str, ...]) -> tuple[int, ...]:
        """The group along ``dims`` that holds ``rank``."""
        self.coords(rank)
        return next(g for g in self.groups(dims) if rank in g)

    def local_rank(self, rank: int, dims: str | tuple[str, ...]) -> int:
        """``rank``'s place in its group along ``dims``."""
        return self.group_of(rank, dims).index(rank)

    def dp_index(self, rank: int) -> int:
        """Which slice of the batch ``rank`` trains on: its place among the data-parallel ranks
        (``dp_replicate x dp_shard``); the CP and TP coordinates do not change it."""
        c = self.coords(rank)
        return c["dp_replicate"] * self.dp_shard + c["dp_shard"]

    def batch_rows(self, rank: int, batch_size: int) -> range:
        """The rows of a global batch of ``batch_size`` that ``rank`` sees: the ``dp_index``-th of
        ``dp`` equal slices (every rank of its CP and TP groups sees the same rows)."""
        _positive("batch size", batch_size)
        if batch_size % self.dp:
            raise ValueError(
                f"the batch of {batch_size} rows does not split into dp = dp_replicate {self.dp_replicate} x "
                f"dp_shard {self.dp_shard} = {self.dp} equal slices; use a multiple of {self.dp}"
            )
        per = batch_size // self.dp
        i = self.dp_index(rank)
        return range(i * per, (i + 1) * per)

    def token_chunks(self, rank: int, seq_len: int) -> tuple[int, int]:
        """The two chunks of a row of ``seq_len`` tokens that ``rank`` holds under load-balanced ring
        attention: the row is cut into ``2 x cp`` chunks and CP rank ``i`` holds chunks ``i`` and
        ``2 cp - 1 - i`` (one early, one late: every rank gets the same amount of causal work)."""
        _positive("sequence length", seq_len)
        if seq_len % (2 * self.cp):
            raise ValueError(
                f"a row of {seq_len} tokens does not cut into 2 x cp = {2 * self.cp} equal chunks; "
                f"use a sequence length divisible by {2 * self.cp}"
            )
        i = self.coords(rank)["cp"]
        return i, 2 * self.cp - 1 - i

    def describe(self) -> str:
        return " x ".join(f"{d} {s}" for d, s in zip(DIMS, self.shape)) + f" = {self.world_size} ranks"


def mesh_groups(degrees: dict[str, int], dims: str | tuple[str, ...]) -> list[tuple[int, ...]]:
    """Exercise 7.1's reference: the groups of the mesh of ``degrees`` along ``dims`` (one dimension,
    or several flattened into one): the ranks whose other coordinates are all equal. Each group lists
    its ranks in the row-major order of the flattened dimensions (taken in the mesh's order, whatever
    order ``dims`` names them in); the groups come in the order of their lowest rank, and every rank
    is in exactly one group."""
    mesh = NDMesh(**{d: degrees[d] for d in DIMS})
    along = _dims(dims)
    by_rest: dict[tuple[int, ...], list[tuple[tuple[int, ...], int]]] = {}
    for r in range(mesh.world_size):
        c = mesh.coords(r)
        rest = tuple(c[d] for d in DIMS if d not in along)
        by_rest.setdefault(rest, []).append((tuple(c[d] for d in along), r))
    groups = [tuple(r for _, r in sorted(members)) for members in by_rest.values()]
    return sorted(groups, key=min)


def batch_plan(degrees: dict[str, int], rank: int, batch_size: int, seq_len: int) -> tuple[range, tuple[int, int]]:
    """Exercise 7.2's reference: the rows of the global batch that ``rank`` trains on and the two
    chunks of each row's tokens it holds (:meth:`NDMesh.batch_rows`, :meth:`NDMesh.token_chunks`)."""
    mesh = NDMesh(**{d: degrees[d] for d in DIMS})
    return mesh.batch_rows(rank, batch_size), mesh.token_chunks(rank, seq_len)


def check_degrees(
    world_size: int,
    local_world_size: int,
    degrees: dict[str, int],
    *,
    n_head: int,
    seq_len: int,
    batch_size: int,
) -> NDMesh:
    """The mesh of ``degrees`` (``dp_replicate``, ``dp_shard``, ``cp``, ``tp``) for ``world_size``
    ranks in nodes of ``local_world_size``, or ValueError naming the values that cannot work and
    what would. Checked in this order:

    1. every degree a positive integer, and their product the world size;
    2. ``tp`` divides the attention heads (each TP rank takes whole heads);
    3. ``2 x cp`` divides the sequence length (load-balanced ring attention);
    4. ``dp = dp_replicate x dp_shard`` divides the batch (each data-parallel rank an equal slice);
    5. ``tp`` divides the ranks of a node: a TP group never crosses nodes;
    6. with replicas (``dp_replicate > 1``), ``dp_shard x cp x tp`` divides the ranks of a node: each
       node holds whole shard groups, and only the replicas' once-a-step all-reduce crosses nodes.
    """
    _positive("world size", world_size)
    _positive("local world size (LOCAL_WORLD_SIZE)", local_world_size)
    unknown = sorted(set(degrees) - set(DIMS))
    if unknown:
        raise ValueError(f"unknown mesh dimension {', '.join(unknown)}: the dimensions are {', '.join(DIMS)}")
    full = {d: degrees.get(d, 1) for d in DIMS}
    for d in DIMS:
        _positive(f"--{d.replace('_', '-')}", full[d])
    mesh = NDMesh(**full)
    given = " x ".join(f"{d} {full[d]}" for d in DIMS)
    if mesh.world_size != world_size:
        raise ValueError(
            f"{given} = {mesh.world_size} ranks, but the world size is {world_size}: the product of the four "
            f"degrees must equal it"
        )
    if n_head % mesh.tp:
        raise ValueError(f"--tp {mesh.tp} does not divide the model's {n_head} attention heads; use a divisor of it")
    if seq_len % (2 * mesh.cp):
        raise ValueError(
            f"--cp {mesh.cp}: the sequence length {seq_len} does not cut into 2 x cp = {2 * mesh.cp} equal "
            f"chunks (load-balanced ring attention); use a cp with 2 x cp dividing {seq_len}"
        )
    if batch_size % mesh.dp:
        raise ValueError(
            f"dp_replicate {mesh.dp_replicate} x dp_shard {mesh.dp_shard} = {mesh.dp} data-parallel ranks do not "
            f"divide the batch of {batch_size} rows; the batch must be a multiple of {mesh.dp}"
        )
    if local_world_size % mesh.tp:
        raise ValueError(
            f"--tp {mesh.tp} does not divide the {local_world_size} ranks of a node (LOCAL_WORLD_SIZE): a "
            f"tensor-parallel group would cross nodes; use a tp dividing {local_world_size}"
        )
    inner = mesh.dp_shard * mesh.cp * mesh.tp
    if mesh.dp_replicate > 1 and local_world_size % inner:
        raise ValueError(
            f"dp_shard {mesh.dp_shard} x cp {mesh.cp} x tp {mesh.tp} = {inner} ranks per replica do not divide "
            f"the {local_world_size} ranks of a node (LOCAL_WORLD_SIZE) while dp_replicate is "
            f"{mesh.dp_replicate}: a replica must sit inside a node; shard over the node's ranks or set "
            f"--dp-replicate 1"
        )
    return mesh
