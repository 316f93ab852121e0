"""Lab 06 · Pipelines and meshes: the graded checks of the mesh exercises, 6.3 (HSDP's degrees) and
6.4 (HSDP's bytes per mesh dimension). Both are plain functions, checked in this process; 6.4 is
also held against the bytes FSDP2 really sent on the 2 x 2 mesh of lab/results/06-mesh-cpu.json.

    make grade EX=6.3          # or: .venv/bin/python -m minigpt.grader --exercise 6.3
"""

from __future__ import annotations

import json
from fractions import Fraction

import pytest

from minigpt.model import GPTConfig, MiniGPT
from tests.launcher import ROOT

pytestmark = [pytest.mark.lab("06"), pytest.mark.timeout(120)]


# ----------------------------------------------------------------------------------------------
# Exercise 6.3: the degrees of an HSDP mesh


@pytest.mark.exercise("6.3")
@pytest.mark.points(2)
def test_resolve_hsdp_shards_inside_a_node_and_infers_the_missing_degree(lab06_mesh):
    cases = [
        # (world, ranks per node, shard, replicate) -> (replicate, shard)
        ((4, 2, None, None), (2, 2)),  # two nodes of two
        ((8, 4, None, None), (2, 4)),  # two nodes of four: shard over a node, not across
        ((16, 8, None, None), (2, 8)),
        ((4, 4, None, None), (1, 4)),  # one node: plain FSDP, one replica
        ((8, 4, 2, None), (4, 2)),  # a shard degree given: the replicas are the rest
        ((8, 4, None, 8), (8, 1)),  # eight replicas of one: plain DDP
        ((8, 4, 8, 1), (1, 8)),  # both given, consistent
    ]
    for args, expected in cases:
        got = lab06_mesh.resolve_hsdp(*args)
        assert tuple(got) == expected, f"resolve_hsdp{args} returned {got}, expected (replicate, shard) = {expected}"


@pytest.mark.exercise("6.3")
@pytest.mark.points(2)
def test_resolve_hsdp_refuses_what_cannot_work_naming_the_numbers(lab06_mesh):
    cases = [
        ((4, 2, 2, 3), ("3", "2", "4")),  # product 6, world 4
        ((4, 2, 3, None), ("3", "4")),  # 3 does not divide 4
        ((8, 4, None, 3), ("3", "8")),
        ((6, 4, None, None), ("6", "4")),  # not a whole number of nodes
        ((4, 2, 0, None), ("0",)),
    ]
    for args, numbers in cases:
        with pytest.raises(ValueError) as caught:
            lab06_mesh.resolve_hsdp(*args)
        message = str(caught.value)
        missing = [n for n in numbers if n not in message]
        assert not missing, f"resolve_hsdp{args}: the message {message!r} does not name {missing}"


# ----------------------------------------------------------------------------------------------
# Exercise 6.4: the bytes of one HSDP step, per mesh dimension


def by_hand(sizes: list[int], shard: int, replicate: int, pb: int, gb: int, reshard: list[bool]) -> dict[str, int]:
    """The rule of the exercise, unit by unit, in exact fractions."""
    inside = across = Fraction(0)
    for size, again in zip(sizes, reshard):
        inside += Fraction(shard - 1, shard) * size * ((2 if again else 1) * pb + gb)
        across += Fraction(2 * (replicate - 1), replicate) * Fraction(size, shard) * gb
    return {"shard": round(inside), "replicate": round(across)}


@pytest.mark.exercise("6.4")
@pytest.mark.points(2)
def test_hsdp_bytes_per_dim_adds_each_units_collectives(lab06_mesh):
    # a hand-worked case: units of 8 and 12 elements, shard 2, replicate 2, 4-byte weights and
    # gradients, the first unit (the root) kept gathered between forward and backward
    got = lab06_mesh.hsdp_bytes_per_dim([8, 12], 2, 2, 4, 4, [False, True])
    assert got == {"shard": 104, "replicate": 40}, f"units [8, 12], shard 2, replicate 2: {got}"
    for sizes, shard, replicate, pb, gb in (([12, 24, 36], 4, 2, 2, 4), ([6, 6], 3, 3, 4, 4), ([10], 2, 1, 4, 4)):
        reshard = [True] * len(sizes)
        got = lab06_mesh.hsdp_bytes_per_dim(sizes, shard, replicate, pb, gb)
        want = by_hand(sizes, shard, replicate, pb, gb, reshard)
        assert got == want, (
            f"units {sizes}, shard {shard}, replicate {replicate}, bytes {pb}/{gb}: {got}, expected {want}"
        )


@pytest.mark.exercise("6.4")
@pytest.mark.points(2)
def test_hsdp_bytes_per_dim_equals_what_fsdp2_sent(lab06_mesh):
    """MiniGPT's FSDP2 units (the root, then each block), each parameter's rows padded to a multiple
    of the shard degree: the formula must give the bytes FSDP2 really sent on the 2 x 2 mesh."""
    report = json.loads((ROOT / "lab" / "results" / "06-mesh-cpu.json").read_text())
    replicate, shard = report["mesh"]["hsdp"]["replicate"], report["mesh"]["hsdp"]["shard"]
    model = MiniGPT(GPTConfig())

    def padded(params) -> int:
        return sum(-(-p.shape[0] // shard) * shard * (p.numel() // p.shape[0]) for p in params)

    in_blocks = {id(p) for b in model.blocks for p in b.parameters()}
    sizes = [padded([p for p in model.parameters() if id(p) not in in_blocks])]
    sizes += [padded(list(b.parameters())) for b in model.blocks]
    got = lab06_mesh.hsdp_bytes_per_dim(sizes, shard, replicate, 4, 4, [False] + [True] * len(model.blocks))
    assert got == report["bytes_per_dim"], (
        f"{got}, but FSDP2 sent {report['bytes_per_dim']} (lab/results/06-mesh-cpu.json)"
    )
