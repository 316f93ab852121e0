"""Lab 07 exercises: the N-D mesh's groups, the batch plan of a rank, and one parameter made whole
again from every rank's pieces.

    make grade EX=7.1          # one exercise (the reference stands in for the others)
    make grade LAB=07          # the whole lab
    make hint EX=7.1           # stuck? the next hint of one exercise (one more on each call)

The reference is ``minigpt/parallel/mesh/`` (``nd.py``, ``compose.py``); try not to peek. All three
are plain functions, checked without a process group. ``lab/07_nd_parallel.py --impl exercises``
uses yours: your groups become its process groups, your batch plan decides which rows each rank
trains on and which tokens its logits are, and your whole parameters are held, bit for bit, against
the state the lab gathers its own way.

The mesh's dimensions, outermost first, are ``DIMS = ("dp_replicate", "dp_shard", "cp", "tp")``; a
rank's coordinates are its row-major index in the grid of the four degrees (tp varies fastest).
"""

from __future__ import annotations

import torch

from minigpt.parallel.mesh.nd import DIMS  # noqa: F401  (the mesh's order: yours to use)

# ----------------------------------------------------------------------------------------------
# Exercise 7.1: the groups of each dimension


def mesh_groups(degrees: dict[str, int], dims: str | tuple[str, ...]) -> list[tuple[int, ...]]:
    """Exercise 7.1: the process groups of one mesh dimension, or of several flattened into one.

    ``degrees`` gives each of the four dimensions its degree (a dict: its keys may come in any
    order; the mesh's order is ``DIMS``). ``dims`` is one dimension's name or a tuple of several
    (FSDP's ``("dp_shard", "cp")``), named in any order.

    Contract: return every group of the world along ``dims``: a group is the set of ranks whose
    coordinates along every *other* dimension are equal. Each group is a tuple of ranks in the
    row-major order of the flattened dimensions taken in the mesh's order; the groups are listed in
    the order of their lowest rank. Every rank of the world is in exactly one group, and a group
    has as many ranks as the product of the degrees of ``dims``. Raise ValueError for a dimension
    that is not one of ``DIMS``.

    Why: every rank creates every group, in the same order, and each collective then runs inside
    one. Tensor parallelism talks in every layer, so its ranks must be consecutive (one node); a
    group built in another order still "works" - on the wrong ranks, over the slow links, or mixing
    ranks that hold different weights.
    """
    raise NotImplementedError("Exercise 7.1: list the groups of the mesh along the given dimensions")


# ----------------------------------------------------------------------------------------------
# Exercise 7.2: which rows and which tokens a rank trains on


def batch_plan(degrees: dict[str, int], rank: int, batch_size: int, seq_len: int) -> tuple[range, tuple[int, int]]:
    """Exercise 7.2: the rows of the global batch ``rank`` trains on, and the two chunks of each row's
    tokens it holds.

    Contract: return ``(rows, (early, late))``. ``rows`` is a ``range`` of the global batch's row
    indices: the batch cut into ``dp = dp_replicate x dp_shard`` equal, consecutive slices, one per
    data-parallel rank, numbered in the mesh's order; ranks that differ only in their cp or tp
    coordinate get the same slice. ``(early, late)`` are the indices of the two chunks of a row
    (cut into ``2 x cp`` equal chunks) that the rank's cp coordinate holds under load-balanced ring
    attention: one early chunk and its mirror from the end. Raise ValueError, naming the numbers,
    when the batch does not split into ``dp`` equal slices or the row into ``2 x cp`` chunks.

    Why: data parallelism needs different rows per replica and shard, or it computes the same
    gradient several times; the ranks of a TP group must see the very same tokens, or their
    all-reduces add pieces of different sentences; a causal mask gives the late tokens most of the
    work, so each CP rank takes one early and one late chunk.
    """
    raise NotImplementedError("Exercise 7.2: plan the rows and the token chunks this rank trains on")


# ----------------------------------------------------------------------------------------------
# Exercise 7.3: one parameter whole again, from its TP slices' FSDP pieces


def whole_parameter(pieces: list[list[torch.Tensor]], rows: int, tp_dim: int | None, parts: int = 1) -> torch.Tensor:
    """Exercise 7.3: one parameter of MiniGPT, whole, from the pieces every rank of the mesh holds.

    In Lab 07 a parameter is cut twice: tensor parallelism gives TP rank ``t`` a slice of it (Lab 05),
    then FSDP cuts that slice over the shard group (Lab 04: along dimension 0, padded with zero rows
    to a multiple of the shard degree, one equal block of rows per shard rank). ``pieces[t][s]`` is
    shard rank ``s``'s piece of TP rank ``t``'s slice; ``rows`` is the slice's true row count.

    ``tp_dim`` says how tensor parallelism cut the whole: along dimension 0, along dimension 1, or not
    at all (None: every TP rank's slice is the whole parameter). ``parts`` > 1 is the fused q, k, v
    weight: its ``parts`` blocks along ``tp_dim`` were each cut over the TP ranks on their own, so each
    slice holds its rows of q, then of k, then of v.

    Contract: return the whole parameter (a new tensor; ``pieces`` unchanged), exactly, bit for bit:
    no padding row left, the TP slices in TP-rank order, the fused blocks back in place.

    Why: it is what saving a checkpoint of an N-D run, or comparing it with one process, must do:
    undo each dimension's cut in the reverse order of the cutting.
    """
    raise NotImplementedError("Exercise 7.3: put one parameter back together from its TP slices' FSDP pieces")
