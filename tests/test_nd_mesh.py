"""Lab 07's 4-D mesh as arithmetic: coordinates, groups, the batch plan and the degree rules,
checked against numpy's own row-major layout (an independent implementation of the same grid)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from minigpt.parallel.mesh.nd import DIMS, NDMesh, check_degrees

SHAPES = [(2, 2, 1, 2), (1, 2, 2, 2), (1, 1, 1, 8), (2, 1, 2, 1), (3, 1, 2, 2), (1, 4, 1, 1)]


def numpy_groups(shape: tuple[int, ...], along: tuple[str, ...]) -> list[tuple[int, ...]]:
    """The groups along ``along``: move those axes last (in mesh order) and read the rows."""
    grid = np.arange(int(np.prod(shape))).reshape(shape)
    axes = [DIMS.index(d) for d in DIMS if d in along]
    rest = [i for i in range(len(DIMS)) if i not in axes]
    rows = np.transpose(grid, rest + axes).reshape(-1, int(np.prod([shape[i] for i in axes])))
    return sorted((tuple(int(x) for x in row) for row in rows), key=min)


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_coordinates_are_numpys_row_major_layout(shape):
    mesh = NDMesh(*shape)
    assert mesh.world_size == int(np.prod(shape))
    for r in range(mesh.world_size):
        expected = dict(zip(DIMS, (int(x) for x in np.unravel_index(r, shape))))
        assert mesh.coords(r) == expected
        assert mesh.rank(expected) == r


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_groups_of_every_dimension_and_flattened_pair_are_numpys(shape):
    mesh = NDMesh(*shape)
    choices = [(d,) for d in DIMS] + [("dp_shard", "cp"), ("dp_replicate", "dp_shard"), ("cp", "tp")]
    for along in choices:
        groups = mesh.groups(along)
        assert groups == numpy_groups(shape, along), along
        assert sorted(itertools.chain(*groups)) == list(range(mesh.world_size))  # a partition
        for g in groups:
            for r in g:
                assert mesh.group_of(r, along) == g
                assert mesh.local_rank(r, along) == g.index(r)


def test_the_default_mesh_of_eight_ranks_as_the_guide_draws_it():
    mesh = NDMesh(dp_replicate=2, dp_shard=2, cp=1, tp=2)
    assert mesh.groups("tp") == [(0, 1), (2, 3), (4, 5), (6, 7)]
    assert mesh.groups("dp_shard") == [(0, 2), (1, 3), (4, 6), (5, 7)]
    assert mesh.groups("dp_replicate") == [(0, 4), (1, 5), (2, 6), (3, 7)]
    assert mesh.groups("cp") == [(r,) for r in range(8)]
    fsdp_cp = NDMesh(dp_replicate=1, dp_shard=2, cp=2, tp=2)
    assert fsdp_cp.groups("cp") == [(0, 2), (1, 3), (4, 6), (5, 7)]
    assert fsdp_cp.groups(("dp_shard", "cp")) == [(0, 2, 4, 6), (1, 3, 5, 7)]
    # the order asked for is not the order used: flattened groups follow the mesh's order
    assert fsdp_cp.groups(("cp", "dp_shard")) == fsdp_cp.groups(("dp_shard", "cp"))


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_only_data_parallel_ranks_see_different_rows_and_cp_ranks_different_tokens(shape):
    mesh = NDMesh(*shape)
    batch = 12 * mesh.dp
    rows = {r: mesh.batch_rows(r, batch) for r in range(mesh.world_size)}
    for g in mesh.groups(("cp", "tp")):  # a CP x TP block: one data-parallel rank
        assert len({(rows[r].start, rows[r].stop) for r in g}) == 1
    firsts = sorted({rows[r].start for r in rows})
    assert firsts == list(range(0, batch, 12)) and all(len(x) == 12 for x in rows.values())
    seq = 8 * mesh.cp
    for g in mesh.groups("cp"):
        chunks = sorted(c for r in g for c in mesh.token_chunks(r, seq))
        assert chunks == list(range(2 * mesh.cp))  # every chunk held once in a CP group
    for g in mesh.groups("tp"):
        assert len({mesh.token_chunks(r, seq) for r in g}) == 1


def test_mesh_refuses_what_is_not_a_mesh():
    with pytest.raises(ValueError, match=r"cp 0 is not a positive integer"):
        NDMesh(1, 1, 0, 1)
    mesh = NDMesh(2, 2, 1, 2)
    with pytest.raises(ValueError, match=r"rank 8 is outside this mesh's 0..7"):
        mesh.coords(8)
    with pytest.raises(ValueError, match=r"each must be one of dp_replicate, dp_shard, cp, tp"):
        mesh.groups("pp")
    with pytest.raises(ValueError, match=r"batch of 6 rows does not split into dp = .* 4 equal slices"):
        mesh.batch_rows(0, 6)
    with pytest.raises(ValueError, match=r"row of 6 tokens does not cut into 2 x cp = 4"):
        NDMesh(1, 1, 2, 1).token_chunks(0, 6)


MODEL = dict(n_head=4, seq_len=32, batch_size=64)


@pytest.mark.parametrize(
    "world, local, degrees",
    [
        (8, 8, dict(dp_replicate=2, dp_shard=2, cp=1, tp=2)),
        (8, 4, dict(dp_replicate=2, dp_shard=2, cp=1, tp=2)),  # two nodes of four: a replica per node
        (8, 8, dict(dp_replicate=1, dp_shard=2, cp=2, tp=2)),
        (8, 4, dict(dp_replicate=1, dp_shard=2, cp=2, tp=2)),  # no replicas: shards may span nodes
        (4, 4, dict(tp=4)),
    ],
)
def test_degrees_that_work(world, local, degrees):
    mesh = check_degrees(world, local, degrees, **MODEL)
    assert mesh.degrees() == {**dict.fromkeys(DIMS, 1), **degrees}


@pytest.mark.parametrize(
    "world, local, degrees, message",
    [
        (8, 8, dict(dp_replicate=2, dp_shard=2, tp=1), r"= 4 ranks, but the world size is 8"),
        (8, 8, dict(dp_shard=1, tp=8), r"--tp 8 does not divide the model's 4 attention heads"),
        (6, 6, dict(cp=6), r"--cp 6: the sequence length 32 does not cut into 2 x cp = 12"),
        (6, 6, dict(dp_shard=2, cp=3), r"--cp 3: the sequence length 32 does not cut into 2 x cp = 6"),
        (6, 6, dict(dp_shard=3, tp=2), r"dp_shard 3 = 3 data-parallel ranks do not divide the batch of 64"),
        (8, 1, dict(dp_replicate=4, tp=2), r"--tp 2 does not divide the 1 ranks of a node"),
        (8, 2, dict(dp_replicate=2, dp_shard=2, tp=2), r"= 4 ranks per replica do not divide the 2 ranks of a node"),
        (8, 8, dict(dp_replicate=8, ep=1), r"unknown mesh dimension ep"),
        (8, 8, dict(dp_replicate=0, tp=8), r"--dp-replicate 0 is not a positive integer"),
    ],
)
def test_degrees_that_cannot_work_are_refused_naming_their_values(world, local, degrees, message):
    with pytest.raises(ValueError, match=message):
        check_degrees(world, local, degrees, **MODEL)
