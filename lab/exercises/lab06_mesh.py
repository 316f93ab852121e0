"""Lab 06 exercises, the mesh half: the degrees of an HSDP mesh and the bytes each of its dimensions
carries. (The pipeline half, Exercises 6.1 and 6.2, is lab/exercises/lab06_pipeline.py.)

    make grade EX=6.3          # one exercise (the reference stands in for the others)
    make grade LAB=06          # the whole lab
    make hint EX=6.3           # stuck? the next hint of one exercise (one more on each call)

The reference is ``minigpt/parallel/mesh/`` (``degrees.py``, ``hsdp.py``); try not to peek. Both are
plain functions: no process group. ``lab/06_mesh.py --impl exercises`` uses yours: your degrees lay
out its HSDP mesh, and your byte count is the model its measured bytes are held against.
"""

from __future__ import annotations

# ----------------------------------------------------------------------------------------------
# Exercise 6.3: the degrees of an HSDP mesh


def resolve_hsdp(
    world_size: int, local_world_size: int, shard: int | None = None, replicate: int | None = None
) -> tuple[int, int]:
    """Exercise 6.3: HSDP's ``(replicate, shard)`` degrees, as OLMo-core resolves them.

    HSDP lays the ``world_size`` ranks out as a ``replicate x shard`` mesh: the parameters are
    sharded over the ``shard`` ranks of a row (one node: fast links) and each row is a replica of
    the others (the gradients' shards are all-reduced down a column, across nodes). torchrun gives
    every rank ``WORLD_SIZE`` and ``LOCAL_WORLD_SIZE`` (the ranks on its node: ``local_world_size``).

    * neither degree given: shard over a node, ``shard = local_world_size``, and replicate over the
      nodes, ``replicate = world_size // local_world_size``;
    * one given: it must divide ``world_size``, and the other is the quotient;
    * both given: their product must be ``world_size``; return them.

    Raise ValueError when it cannot work: a degree (or size) that is not a positive integer, a
    product that is not the world size, a degree that does not divide it, a world that is not a
    whole number of nodes. The message names every number involved and the world size (for example
    ``"replicate 3 x shard 2 = 6, but the world size is 4"``).

    Why: the shard group's all-gathers and reduce-scatters run every unit, every step, so they belong
    on the fast links inside a node; only the gradient shards' all-reduce crosses nodes. Swapped
    degrees put the heavy traffic on the slow links.
    """
    raise NotImplementedError(
        "Exercise 6.3: resolve (replicate, shard) from the world and node sizes, and validate them"
    )


# ----------------------------------------------------------------------------------------------
# Exercise 6.4: the bytes of one HSDP step, per mesh dimension


def hsdp_bytes_per_dim(
    unit_sizes: list[int],
    shard: int,
    replicate: int,
    param_bytes: int = 4,
    grad_bytes: int = 4,
    reshard_after_forward: list[bool] | None = None,
) -> dict[str, int]:
    """Exercise 6.4: the bytes one rank sends in one HSDP training step, along each dimension.

    ``unit_sizes[i]`` is FSDP unit i's element count, already padded to a multiple of ``shard``.
    With ring collectives a rank sends (n-1)/n of the buffer in an all-gather or a reduce-scatter
    over n ranks, and 2(n-1)/n of it in an all-reduce. Per unit, in one step:

    * in the **shard** group (``shard`` ranks): the weights all-gathered before forward, and again
      before backward when ``reshard_after_forward[i]`` (default: True for every unit), each
      ``unit_sizes[i] * param_bytes`` bytes; the gradient reduce-scattered,
      ``unit_sizes[i] * grad_bytes`` bytes;
    * in the **replicate** group (``replicate`` ranks, one per row of the mesh, nothing when
      ``replicate == 1``): the reduced gradient shard, ``unit_sizes[i] / shard`` elements of
      ``grad_bytes``, all-reduced.

    Return ``{"shard": bytes, "replicate": bytes}``, each the exact total rounded to an int once at
    the end.

    Why: the model says, before any run, how much each dimension of the mesh carries: the course
    holds it against the bytes FSDP2 really sent on a 2 x 2 mesh.
    """
    raise NotImplementedError("Exercise 6.4: add up the bytes each mesh dimension carries in one HSDP step")
