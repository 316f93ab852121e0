"""Lab 07 · All dimensions at once: the graded checks.

The three exercises are plain functions, checked in this process with no process group: the groups
of each mesh dimension (7.1), the rows and token chunks a rank trains on (7.2), and one parameter made
whole again from the FSDP pieces of its TP slices (7.3). The expected values are worked out here
independently: the groups by hand for the lab's two layouts and with numpy's reshape for any other
mesh, the pieces by cutting a tensor with ``torch.chunk`` and zero padding. ``lab/07_nd_parallel.py
--impl exercises`` then runs the learner's three functions inside the 8-rank check (the course's own
test of it is tests/test_lab07_script.py).

    make grade EX=7.1          # or: .venv/bin/python -m minigpt.grader --exercise 7.1
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from minigpt.model import GPTConfig, MiniGPT
from tests.words import say, short

pytestmark = [pytest.mark.lab("07"), pytest.mark.timeout(120)]

DIMS = ("dp_replicate", "dp_shard", "cp", "tp")
HSDP_TP = {"dp_replicate": 2, "dp_shard": 2, "cp": 1, "tp": 2}  # the lab's first layout
FSDP_CP_TP = {"dp_replicate": 1, "dp_shard": 2, "cp": 2, "tp": 2}  # its second


def oracle_groups(degrees: dict[str, int], dims: tuple[str, ...]) -> list[tuple[int, ...]]:
    """The groups from numpy: the ranks laid out row-major in the mesh's order, the flattened
    dimensions moved last (in the mesh's order) and read row by row."""
    grid = np.arange(int(np.prod([degrees[d] for d in DIMS]))).reshape([degrees[d] for d in DIMS])
    along = [i for i, d in enumerate(DIMS) if d in dims]
    rest = [i for i in range(len(DIMS)) if i not in along]
    rows = grid.transpose(rest + along).reshape(-1, int(np.prod([grid.shape[i] for i in along])))
    return sorted((tuple(int(r) for r in row) for row in rows), key=min)


def as_tuples(groups) -> list[tuple[int, ...]]:
    return [tuple(int(r) for r in g) for g in groups]


def coordinates(degrees: dict[str, int], rank: int) -> dict[str, int]:
    """A rank's coordinates: its row-major index in the grid of the degrees, in DIMS order."""
    place = np.unravel_index(rank, [degrees[d] for d in DIMS])
    return {d: int(i) for d, i in zip(DIMS, place)}


def at(degrees: dict[str, int], rank: int) -> str:
    """``rank 5 = (dp_replicate 1, dp_shard 0, cp 0, tp 1)``."""
    where = coordinates(degrees, rank)
    return f"rank {rank} = (" + ", ".join(f"{d} {where[d]}" for d in DIMS) + ")"


def mesh_name(degrees: dict[str, int]) -> str:
    return " x ".join(str(degrees[d]) for d in DIMS)


def varies_fastest(lab07, degrees: dict[str, int]) -> str | None:
    """The dimension along which the learner's groups put ranks 0 and 1 together: the one their
    layout varies fastest (None when no dimension does, or a call fails)."""
    for dim in DIMS:
        if degrees[dim] == 1:
            continue
        try:
            groups = as_tuples(lab07.mesh_groups(dict(degrees), dim))
        except Exception:  # noqa: BLE001 - a clue for the message, not a test of its own
            return None
        if any(0 in g and 1 in g for g in groups):
            return dim
    return None


def layout_problem(lab07, degrees: dict[str, int], dims, got: list[tuple[int, ...]], want: list[tuple[int, ...]]):
    """Why the learner's groups along ``dims`` are not the mesh's: a rank and the rank it was grouped
    with, with their coordinates, and which dimension the learner's layout varies fastest, in both
    languages (english, spanish)."""
    named = (dims,) if isinstance(dims, str) else tuple(dims)
    along = " x ".join(named)
    mine = {r: g for g in got for r in g}
    theirs = {r: g for g in want for r in g}
    rank = next((r for r in sorted(theirs) if mine.get(r) != theirs[r]), None)
    if rank is None:
        return (f"{short(got, 160)}, expected {short(want, 160)}",) * 2
    head = (
        f"your {along} group of rank {rank} is {mine.get(rank, 'missing')}, expected {theirs[rank]}",
        f"tu grupo {along} del rank {rank} es {mine.get(rank, 'inexistente')}, se espera {theirs[rank]}",
    )
    if rank in mine and set(mine[rank]) == set(theirs[rank]):
        order = " (" + ", ".join(d for d in DIMS if d in named) + ")"
        return (
            f"{head[0]}: the same ranks, in another order; a flattened group's ranks come in the mesh's order"
            f"{order}, whatever order the names come in",
            f"{head[1]}: los mismos ranks, en otro orden; los ranks de un grupo aplanado van en el orden de la malla"
            f"{order}, sea cual sea el orden de los nombres",
        )
    stranger = next((r for r in mine.get(rank, ()) if r not in theirs[rank]), None)
    if stranger is None:
        stranger = next(r for r in theirs[rank] if r not in mine.get(rank, ()))
        pair = (f"; {at(degrees, stranger)} is missing from it", f"; falta {at(degrees, stranger)}")
    else:
        apart = [d for d in DIMS if coordinates(degrees, rank)[d] != coordinates(degrees, stranger)[d]]
        pair = (
            f": it holds {at(degrees, stranger)}, which differs from {at(degrees, rank)} in {', '.join(apart)}, "
            f"not only in {along}",
            f": contiene el {at(degrees, stranger)}, que difiere del {at(degrees, rank)} en {', '.join(apart)}, "
            f"no solo en {along}",
        )
    english, spanish = head[0] + pair[0], head[1] + pair[1]
    fastest = next(d for d in reversed(DIMS) if degrees[d] > 1)
    yours = varies_fastest(lab07, degrees)
    if yours is not None and yours != fastest:
        english += (
            f"; expected {fastest} to vary fastest (row-major in the order {', '.join(DIMS)}); yours varies "
            f"{yours} fastest"
        )
        spanish += (
            f"; se espera que {fastest} varíe más deprisa (por filas en el orden {', '.join(DIMS)}); en tu "
            f"disposición varía más deprisa {yours}"
        )
    return english, spanish


def check_groups(lab07, degrees: dict[str, int], dims, want: list[tuple[int, ...]]) -> None:
    got = as_tuples(lab07.mesh_groups(dict(degrees), dims))
    if got == want:
        return
    english, spanish = layout_problem(lab07, degrees, dims, got, want)
    where = f"{mesh_name(degrees)}, {dims}" + (f" (degrees {degrees})" if list(degrees) != list(DIMS) else "")
    where_es = f"{mesh_name(degrees)}, {dims}" + (f" (grados {degrees})" if list(degrees) != list(DIMS) else "")
    raise AssertionError(say(f"{where}: {english}", f"{where_es}: {spanish}"))


# ----------------------------------------------------------------------------------------------
# Exercise 7.1: the groups of each dimension


@pytest.mark.exercise("7.1")
@pytest.mark.points(2)
def test_mesh_groups_of_the_labs_two_layouts(lab07):
    """The groups of lab/07_nd_parallel.py's two layouts, worked out by hand (the picture on the lab
    page): tp innermost, so a TP group is two consecutive ranks."""
    expected = {
        "tp": [(0, 1), (2, 3), (4, 5), (6, 7)],
        "cp": [(0,), (1,), (2,), (3,), (4,), (5,), (6,), (7,)],
        "dp_shard": [(0, 2), (1, 3), (4, 6), (5, 7)],
        "dp_replicate": [(0, 4), (1, 5), (2, 6), (3, 7)],
    }
    for dim, want in expected.items():
        check_groups(lab07, HSDP_TP, dim, want)
    expected = {
        "tp": [(0, 1), (2, 3), (4, 5), (6, 7)],
        "cp": [(0, 2), (1, 3), (4, 6), (5, 7)],
        "dp_shard": [(0, 4), (1, 5), (2, 6), (3, 7)],
        "dp_replicate": [(0,), (1,), (2,), (3,), (4,), (5,), (6,), (7,)],
    }
    for dim, want in expected.items():
        check_groups(lab07, FSDP_CP_TP, dim, want)


@pytest.mark.exercise("7.1")
@pytest.mark.points(2)
def test_mesh_groups_follow_the_mesh_order_whatever_the_dicts_order(lab07):
    """The degrees come in a dict whose keys may be in any order: the mesh's order is DIMS, tp
    innermost. Meshes of 12 and 24 ranks with unequal degrees, against numpy's reshape."""
    meshes = [
        {"tp": 2, "cp": 1, "dp_shard": 2, "dp_replicate": 2},  # the first layout, keys reversed
        {"dp_shard": 3, "tp": 2, "dp_replicate": 1, "cp": 2},
        {"cp": 2, "dp_replicate": 2, "tp": 3, "dp_shard": 2},
        {"dp_replicate": 4, "dp_shard": 1, "cp": 1, "tp": 2},
    ]
    for degrees in meshes:
        for dim in DIMS:
            check_groups(lab07, degrees, dim, oracle_groups(degrees, (dim,)))


@pytest.mark.exercise("7.1")
@pytest.mark.points(1)
def test_mesh_groups_flatten_several_dimensions_in_the_mesh_order(lab07):
    """FSDP's group in the second layout is ``dp_shard x cp`` flattened: named in either order, its
    ranks come in the mesh's row-major order (dp_shard, then cp)."""
    for dims in (("dp_shard", "cp"), ("cp", "dp_shard")):
        check_groups(lab07, FSDP_CP_TP, dims, [(0, 2, 4, 6), (1, 3, 5, 7)])
    degrees = {"dp_replicate": 2, "dp_shard": 3, "cp": 2, "tp": 2}
    for dims in (("tp", "dp_replicate"), ("dp_shard", "cp", "tp"), ("cp", "dp_replicate", "dp_shard")):
        check_groups(lab07, degrees, dims, oracle_groups(degrees, dims))


@pytest.mark.exercise("7.1")
@pytest.mark.points(1)
def test_mesh_groups_refuse_an_unknown_dimension(lab07):
    for dims in ("pp", ("dp_shard", "dp"), "TP"):
        with pytest.raises(ValueError):
            got = lab07.mesh_groups(dict(HSDP_TP), dims)
            raise AssertionError(
                say(
                    f"mesh_groups(..., {dims!r}) returned {short(got)}: a dimension that is not one of {DIMS} "
                    "must raise ValueError",
                    f"mesh_groups(..., {dims!r}) devolvió {short(got)}: una dimensión que no es una de {DIMS} "
                    "debe lanzar ValueError",
                )
            )


# ----------------------------------------------------------------------------------------------
# Exercise 7.2: which rows and which tokens a rank trains on


@pytest.mark.exercise("7.2")
@pytest.mark.points(2)
def test_batch_plan_gives_data_parallel_ranks_their_own_rows_and_tp_cp_ranks_the_same(lab07):
    # the first layout, by hand: ranks (0, 1) are one TP group, one data-parallel rank: rows 0..15
    want = {0: (0, 16), 1: (0, 16), 2: (16, 32), 3: (16, 32), 4: (32, 48), 5: (32, 48), 6: (48, 64), 7: (48, 64)}
    for rank, (start, stop) in want.items():
        rows, _ = lab07.batch_plan(dict(HSDP_TP), rank, 64, 32)
        assert isinstance(rows, range) and rows == range(start, stop), rows_problem(
            lab07, HSDP_TP, rank, 64, rows, range(start, stop)
        )
    # any mesh: the data-parallel index is the rank's place among dp_replicate x dp_shard (numpy)
    for degrees in (
        FSDP_CP_TP,
        {"dp_replicate": 2, "dp_shard": 3, "cp": 2, "tp": 2},
        {"tp": 4, "cp": 1, "dp_shard": 1, "dp_replicate": 2},
    ):
        shape = [degrees[d] for d in DIMS]
        dp = degrees["dp_replicate"] * degrees["dp_shard"]
        batch = 12 * dp
        for rank in range(int(np.prod(shape))):
            rep, shard, _, _ = np.unravel_index(rank, shape)
            i = int(rep) * degrees["dp_shard"] + int(shard)
            rows, _ = lab07.batch_plan(dict(degrees), rank, batch, 32)
            assert rows == range(12 * i, 12 * (i + 1)), rows_problem(
                lab07, degrees, rank, batch, rows, range(12 * i, 12 * (i + 1))
            )


def rows_problem(lab07, degrees: dict[str, int], rank: int, batch: int, rows, want: range) -> str:
    """A rank given the wrong rows: its coordinates, its data-parallel index, and a rank that differs
    from it only in cp or tp (which must share its rows) when there is one."""
    where = coordinates(degrees, rank)
    index = where["dp_replicate"] * degrees["dp_shard"] + where["dp_shard"]
    dp = degrees["dp_replicate"] * degrees["dp_shard"]
    mates = [
        r
        for r in range(int(np.prod([degrees[d] for d in DIMS])))
        if r != rank and all(coordinates(degrees, r)[d] == where[d] for d in ("dp_replicate", "dp_shard"))
    ]
    english = (
        f"{mesh_name(degrees)}, {at(degrees, rank)}, a batch of {batch}: rows {rows!r}, expected {want!r}: its "
        f"data-parallel index is {index} of {dp} (its dp_replicate coordinate {where['dp_replicate']} times the "
        f"dp_shard degree {degrees['dp_shard']}, plus its dp_shard coordinate {where['dp_shard']})"
    )
    spanish = (
        f"{mesh_name(degrees)}, {at(degrees, rank)}, un lote de {batch}: filas {rows!r}, se espera {want!r}: su "
        f"índice de datos paralelos es {index} de {dp} (su coordenada dp_replicate {where['dp_replicate']} por el "
        f"grado dp_shard {degrees['dp_shard']}, más su coordenada dp_shard {where['dp_shard']})"
    )
    if mates:
        try:
            theirs = lab07.batch_plan(dict(degrees), mates[0], batch, 32)[0]
        except Exception:  # noqa: BLE001 - a clue for the message only
            theirs = None
        english += (
            f"; {at(degrees, mates[0])} differs from it only in cp or tp and must share its rows (yours gives it "
            f"{theirs!r})"
        )
        spanish += (
            f"; el {at(degrees, mates[0])} solo difiere de él en cp o tp y debe compartir sus filas (tu código le "
            f"da {theirs!r})"
        )
    return say(english, spanish)


def pairs_problem(lab07, degrees: dict[str, int], got: dict[int, tuple], want: dict[int, tuple]) -> str:
    """The chunks every rank got against the balanced pairs, with the first wrong rank's coordinates,
    and a likely cause when the pairs follow ``rank % cp`` instead of the cp coordinate."""
    cp = degrees["cp"]
    rank = next(r for r in sorted(want) if tuple(got[r]) != want[r])
    c = coordinates(degrees, rank)["cp"]
    mine = " ".join(f"{r}:{tuple(got[r])}" for r in sorted(got))
    pairs = ", ".join(f"cp {k}: ({k}, {2 * cp - 1 - k})" for k in range(cp))
    english = (
        f"{mesh_name(degrees)}, {at(degrees, rank)}: chunks {tuple(got[rank])}, expected {want[rank]}, the pair of "
        f"its cp coordinate {c}: one early chunk and its mirror from the end of the {2 * cp} chunks. Chunks by "
        f"rank, yours: {mine}; the balanced pairs: {pairs}"
    )
    spanish = (
        f"{mesh_name(degrees)}, {at(degrees, rank)}: trozos {tuple(got[rank])}, se espera {want[rank]}, el par de su "
        f"coordenada cp {c}: un trozo temprano y su espejo desde el final de los {2 * cp} trozos. Trozos por rank, "
        f"los tuyos: {mine}; los pares equilibrados: {pairs}"
    )
    by_rank = all(tuple(got[r]) == (r % cp, 2 * cp - 1 - r % cp) for r in got)
    if by_rank and cp > 1 and degrees["tp"] > 1:
        english += (
            f"; yours picks the pair of rank % cp, not of the rank's cp coordinate: tp varies faster than cp, so "
            f"the {degrees['tp']} ranks of a TP group share one cp coordinate"
        )
        spanish += (
            f"; tu código elige el par de rank % cp, no el de la coordenada cp del rank: tp varía más deprisa que cp, "
            f"así que los {degrees['tp']} ranks de un grupo TP comparten una coordenada cp"
        )
    return say(english, spanish)


@pytest.mark.exercise("7.2")
@pytest.mark.points(2)
def test_batch_plan_token_chunks_balance_the_causal_work(lab07):
    cases = [(FSDP_CP_TP, {0: (0, 3), 1: (0, 3), 2: (1, 2), 3: (1, 2), 4: (0, 3), 6: (1, 2)})]
    cases.append(({"dp_replicate": 1, "dp_shard": 1, "cp": 4, "tp": 1}, {0: (0, 7), 1: (1, 6), 2: (2, 5), 3: (3, 4)}))
    cases.append((HSDP_TP, {r: (0, 1) for r in range(8)}))  # cp 1: the row's two halves, both held
    for degrees, want in cases:
        world = int(np.prod([degrees[d] for d in DIMS]))
        got = {rank: lab07.batch_plan(dict(degrees), rank, 16, 32)[1] for rank in range(world)}
        assert all(tuple(got[rank]) == chunks for rank, chunks in want.items()), pairs_problem(
            lab07, degrees, got, want
        )
    # why: under a causal mask, token t attends to t + 1 keys; each CP rank must get the same work
    cp, seq = 4, 64
    degrees = {"dp_replicate": 1, "dp_shard": 1, "cp": cp, "tp": 1}
    size = seq // (2 * cp)
    work = []
    for rank in range(cp):
        _, chunks = lab07.batch_plan(dict(degrees), rank, 4, seq)
        work.append(sum(t + 1 for c in chunks for t in range(c * size, (c + 1) * size)))
    assert len(set(work)) == 1, f"the causal work of the {cp} CP ranks: {work}, expected equal"


@pytest.mark.exercise("7.2")
@pytest.mark.points(1)
def test_batch_plan_refuses_what_does_not_split(lab07):
    cases = [
        ((HSDP_TP, 0, 10, 32), ("10", "4")),  # 4 data-parallel ranks, 10 rows
        ((FSDP_CP_TP, 0, 16, 30), ("30", "4")),  # 2 x cp = 4 chunks of 30 tokens
    ]
    for args, numbers in cases:
        try:
            got = lab07.batch_plan(dict(args[0]), *args[1:])
        except ValueError as exc:
            missing = [n for n in numbers if n not in str(exc)]
            assert not missing, f"batch_plan{args[1:]}: the message {str(exc)!r} does not name {missing}"
        else:
            raise AssertionError(
                say(
                    f"batch_plan(degrees {args[0]}, rank {args[1]}, batch {args[2]}, seq {args[3]}) returned "
                    f"{short(got)}: it must raise ValueError naming {', '.join(numbers)}",
                    f"batch_plan(grados {args[0]}, rank {args[1]}, lote {args[2]}, secuencia {args[3]}) devolvió "
                    f"{short(got)}: debe lanzar ValueError nombrando {', '.join(numbers)}",
                )
            )


# ----------------------------------------------------------------------------------------------
# Exercise 7.3: one parameter whole again


def fsdp_pieces(t: torch.Tensor, shards: int) -> list[torch.Tensor]:
    """Lab 04's cut, written again here: zero rows up to a multiple of ``shards``, equal blocks."""
    rows = t.shape[0]
    padded = -(-rows // shards) * shards
    full = torch.cat([t, t.new_zeros((padded - rows, *t.shape[1:]))])
    return [p.clone() for p in full.chunk(shards)]


def cut(whole: torch.Tensor, tp: int, shards: int, tp_dim: int | None, parts: int = 1) -> tuple[list, int]:
    """Each TP rank's slice (each of ``parts`` blocks cut on its own), then its FSDP pieces."""
    if tp_dim is None:
        slices = [whole.clone() for _ in range(tp)]
    else:
        blocks = [b.chunk(tp, dim=tp_dim) for b in whole.chunk(parts, dim=tp_dim)]
        slices = [torch.cat([b[t] for b in blocks], dim=tp_dim) for t in range(tp)]
    return [fsdp_pieces(s, shards) for s in slices], slices[0].shape[0]


def check_whole(lab07, whole, tp, shards, tp_dim, parts=1, what=""):
    pieces, rows = cut(whole, tp, shards, tp_dim, parts)
    got = lab07.whole_parameter(pieces, rows, tp_dim, parts)
    ok = torch.is_tensor(got) and got.shape == whole.shape and got.dtype == whole.dtype and torch.equal(got, whole)
    assert ok, say(
        f"{what}: a {tuple(whole.shape)} parameter cut over tp {tp} along dim {tp_dim} (parts {parts}), then over "
        f"{shards} shard ranks: whole_parameter returned "
        + (f"shape {tuple(got.shape)}" if torch.is_tensor(got) else short(got))
        + ", not the parameter, bit for bit",
        f"{what}: un parámetro de {tuple(whole.shape)} cortado en tp {tp} por la dimensión {tp_dim} (partes {parts}) "
        f"y luego en {shards} ranks de fragmentación: whole_parameter devolvió "
        + (f"forma {tuple(got.shape)}" if torch.is_tensor(got) else short(got))
        + ", no el parámetro, bit a bit",
    )
    return pieces, got


@pytest.mark.exercise("7.3")
@pytest.mark.points(2)
def test_whole_parameter_undoes_the_tp_cut_and_the_fsdp_padding(lab07):
    g = torch.Generator().manual_seed(7)
    for shape, tp, shards, tp_dim in [
        ((8, 6), 2, 2, 0),  # no padding
        ((10, 6), 2, 3, 0),  # each TP slice of 5 rows padded to 6
        ((6, 8), 2, 4, 1),  # cut in columns: 6 rows padded to 8
        ((12, 4), 4, 2, 0),
        ((7, 12), 3, 2, 1),
    ]:
        whole = torch.randn(shape, generator=g, dtype=torch.float64)
        check_whole(lab07, whole, tp, shards, tp_dim, what=f"tp_dim {tp_dim}")


@pytest.mark.exercise("7.3")
@pytest.mark.points(2)
def test_whole_parameter_puts_the_fused_qkv_weight_back(lab07):
    """q, k and v are each cut over the TP ranks: a TP slice is [q_t; k_t; v_t], and the whole is
    every rank's q, then every rank's k, then every rank's v."""
    g = torch.Generator().manual_seed(11)
    for tp, shards in [(2, 2), (2, 3), (4, 1)]:
        whole = torch.randn(3 * 8, 5, generator=g)
        check_whole(lab07, whole, tp, shards, 0, parts=3, what=f"qkv, tp {tp}")


@pytest.mark.exercise("7.3")
@pytest.mark.points(1)
def test_whole_parameter_of_a_tp_whole_tensor_is_a_new_tensor(lab07):
    """A layer norm's weight is whole on every TP rank (tp_dim None); FSDP still cut it in rows. The
    result is a new tensor: writing into it leaves the pieces alone."""
    for shards in (2, 1):  # 5 rows over 2 shards (one padding row), or one shard rank holding them all
        whole = torch.arange(1.0, 6.0)
        pieces, got = check_whole(lab07, whole, 2, shards, None, what="tp_dim None")
        before = [[p.clone() for p in by_shard] for by_shard in pieces]
        got.add_(100.0)
        assert all(torch.equal(p, q) for a, b in zip(pieces, before) for p, q in zip(a, b)), say(
            f"whole_parameter returned a view of the pieces ({shards} shard ranks): writing into the whole changed "
            "a rank's piece",
            f"whole_parameter devolvió una vista de los trozos ({shards} ranks de fragmentación): escribir en el todo "
            "cambió el trozo de un rank",
        )


@pytest.mark.exercise("7.3")
@pytest.mark.points(1)
def test_whole_parameter_rebuilds_minigpt_from_a_tp2_by_shard3_cut(lab07):
    """Every parameter of MiniGPT (its default shape) cut as lab/07_nd_parallel.py cuts it, tp 2 and a
    shard group of 3, rebuilt by whole_parameter: the model's state, bit for bit."""
    torch.manual_seed(0)
    model = MiniGPT(GPTConfig())
    layout = {"wte.weight": (0, 1)}
    for i in range(len(model.blocks)):
        pre = f"blocks.{i}."
        layout |= {pre + "attn.qkv.weight": (0, 3), pre + "attn.proj.weight": (1, 1), pre + "mlp.fc.weight": (0, 1)}
        layout |= {pre + "mlp.fc.bias": (0, 1), pre + "mlp.proj.weight": (1, 1)}
    vocab = model.config.vocab_size
    for name, p in model.named_parameters():
        whole = p.detach()
        if name == "wte.weight" and vocab % 2:  # Lab 05 pads the vocabulary to a multiple of tp
            whole = torch.cat([whole, whole.new_zeros(1, whole.shape[1])])
        tp_dim, parts = layout.get(name, (None, 1))
        check_whole(lab07, whole, 2, 3, tp_dim, parts, what=name)


# ----------------------------------------------------------------------------------------------
# All together: your groups, your batch plan and your join, on the lab's two layouts


@pytest.mark.exercise("all")
@pytest.mark.points(2)
def test_all_together_your_mesh_feeds_every_rank_and_rebuilds_minigpt(lab07):
    """What lab/07_nd_parallel.py --impl exercises does with your three functions, without a process
    group: each rank finds its place in its TP and FSDP groups from your ``mesh_groups`` (a group's
    ranks in sorted order, as ``dist.new_group`` numbers them), reads its rows and tokens from your
    ``batch_plan``, and holds the FSDP piece of its TP slice of MiniGPT's fused q, k, v weight; your
    ``whole_parameter`` joins the pieces back. The ranks that hold the same weights must see every
    token of the batch exactly once, and the joined weight must be the model's, bit for bit."""
    torch.manual_seed(0)
    model = MiniGPT(GPTConfig())
    weight = model.blocks[0].attn.qkv.weight.detach()
    # the vocabulary padded to a multiple of tp as Lab 05 pads it (609 rows + 1): 305 rows per TP slice,
    # which FSDP pads to 306 over 2 shard ranks and to 308 over 4
    embedding = torch.cat([model.wte.weight.detach(), torch.zeros(1, model.config.n_embd)])
    batch, seq = 64, 32
    for degrees in (HSDP_TP, FSDP_CP_TP):
        name = " x ".join(str(degrees[d]) for d in DIMS)
        world = int(np.prod([degrees[d] for d in DIMS]))
        tp_of = {r: tuple(sorted(g)) for g in lab07.mesh_groups(dict(degrees), "tp") for r in g}
        shard_of = {r: tuple(sorted(g)) for g in lab07.mesh_groups(dict(degrees), ("dp_shard", "cp")) for r in g}
        replica_of = {r: tuple(sorted(g)) for g in lab07.mesh_groups(dict(degrees), "dp_replicate") for r in g}
        # two nodes of four (LOCAL_WORLD_SIZE=4): TP inside a node; with replicas, whole shard groups too
        inside = [tp_of] + ([shard_of] if degrees["dp_replicate"] > 1 else [])
        crossing = sorted({g for of in inside for g in of.values() if len({r // 4 for r in g}) > 1})
        assert not crossing, say(
            f"{name}, two nodes of four ranks: the groups {crossing} cross the nodes; TP (and, with replicas, "
            "the shard group) must stay on one node's fast links",
            f"{name}, dos nodos de cuatro ranks: los grupos {crossing} cruzan los nodos; TP (y, con réplicas, el "
            "grupo de fragmentación) debe quedarse en los enlaces rápidos de un nodo",
        )
        # every token of the batch, once, among the ranks that hold TP slice 0
        seen: dict[tuple[int, int], int] = {}
        for r in range(world):
            rows, chunks = lab07.batch_plan(dict(degrees), r, batch, seq)
            for other in tp_of[r]:  # a TP group's ranks: the very same rows and tokens
                assert lab07.batch_plan(dict(degrees), other, batch, seq) == (rows, chunks), say(
                    f"{name}: ranks {r} and {other} are one TP group but get different rows or tokens",
                    f"{name}: los ranks {r} y {other} son un grupo TP pero reciben filas o tokens distintos",
                )
            if tp_of[r].index(r) == 0:
                size = seq // (2 * degrees["cp"])
                for row in rows:
                    for c in chunks:
                        for t in range(c * size, (c + 1) * size):
                            seen[row, t] = seen.get((row, t), 0) + 1
        assert len(seen) == batch * seq and set(seen.values()) == {1}, say(
            f"{name}: the ranks of TP slice 0 see {len(seen)} of the batch's {batch * seq} tokens, some "
            f"{max(seen.values(), default=0)} times: every token once is what one process trains on",
            f"{name}: los ranks de la porción TP 0 ven {len(seen)} de los {batch * seq} tokens del lote, algunos "
            f"{max(seen.values(), default=0)} veces: cada token una vez es lo que entrena un proceso",
        )
        # each rank's piece of its TP slice, placed by its position in your groups
        tp, shards = degrees["tp"], degrees["dp_shard"] * degrees["cp"]
        for what, whole, parts in (("q, k, v", weight, 3), ("embedding", embedding, 1)):
            pieces, rows = cut(whole, tp, shards, 0, parts=parts)
            held: list[list] = [[None] * shards for _ in range(tp)]
            for r in range(world):
                if replica_of[r].index(r) == 0:
                    t, s = tp_of[r].index(r), shard_of[r].index(r)
                    held[t][s] = pieces[t][s]
            missing = [(t, s) for t in range(tp) for s in range(shards) if held[t][s] is None]
            assert not missing, f"{name}: no rank of replica 0 holds the pieces (tp, shard) {missing}"
            got = lab07.whole_parameter(held, rows, 0, parts)
            assert torch.is_tensor(got) and got.shape == whole.shape and torch.equal(got, whole), say(
                f"{name}: MiniGPT's {what} weight joined from every rank's piece is not the weight",
                f"{name}: el peso {what} de MiniGPT unido a partir del trozo de cada rank no es el peso",
            )
