"""Lab 07's script as a learner runs it across two machines: two torchruns of four ranks each
(``--nnodes=2 --nproc_per_node=4`` on localhost, LOCAL_WORLD_SIZE=4), both of the lab's layouts in
one launch - HSDP x TP (2 x 2 x 1 x 2) and FSDP x CP x TP (1 x 2 x 2 x 2) - its report held against
numbers this file works out itself: the groups from the coordinates, and each dimension's bytes from
MiniGPT's parameter shapes, the batch and the ring factors."""

from __future__ import annotations

import json
import math
from concurrent.futures import Future
from pathlib import Path

import pytest

from minigpt.model import GPTConfig, MiniGPT
from minigpt.parallel import proof
from minigpt.train import TrainConfig
from tests import background, launcher
from tests.limits import limit
from tests.test_lab06_mesh_script import two_nodes

pytestmark = pytest.mark.timeout(600)

HSDP_TP, FSDP_CP_TP = (2, 2, 1, 2), (1, 2, 2, 2)  # dp_replicate, dp_shard, cp, tp


def tp_local_units(tp: int) -> list[list[tuple[int, ...]]]:
    """The shapes each rank of ``tp`` holds, unit by unit (the root: what no block holds; then each
    block): attention's qkv and the MLP's first layer cut by rows (outputs), the two output
    projections by columns (inputs), the vocabulary padded to a multiple of tp and cut by rows, the
    rest whole. The tied output layer is the embedding: counted once."""
    units: dict[str, list[tuple[int, ...]]] = {}
    vocab = GPTConfig().vocab_size
    for name, p in MiniGPT(GPTConfig()).named_parameters():
        shape = tuple(p.shape)
        if name == "wte.weight":
            shape = (-(-vocab // tp) * tp // tp, shape[1])
        elif name.endswith(("qkv.weight", "fc.weight", "fc.bias")):
            shape = (shape[0] // tp, *shape[1:])
        elif name.endswith(("attn.proj.weight", "mlp.proj.weight")):
            shape = (shape[0], shape[1] // tp)
        unit = ".".join(name.split(".")[:2]) if name.startswith("blocks.") else "root"
        units.setdefault(unit, []).append(shape)
    return [units.pop("root"), *units.values()]


def expected_bytes(layout: tuple[int, int, int, int]) -> dict[str, int]:
    """One rank's bytes in one step along each dimension, float32."""
    R, S, C, T = layout
    cfg = TrainConfig()
    rows, tokens = cfg.batch_size // (R * S), cfg.block_size // C
    ring = lambda n: 2 * (n - 1) / n  # noqa: E731 - an all-reduce's factor
    # tp: per block two all-reduces of the activations forward and two backward, the embedding's and
    # the output layer's, the loss's 3 numbers per token, and the clipping norm's one number
    bsh, bs = rows * tokens * cfg.n_embd * 4, rows * tokens * 4
    tp = ((4 * cfg.n_layer + 2) * bsh + 3 * bs + 4) * ring(T)
    # cp: each layer, this rank's heads' K and V of the whole row but its own chunks, forward and back
    head_dim = cfg.n_embd // cfg.n_head
    cp = 2 * cfg.n_layer * (C - 1) / C * 2 * rows * (cfg.n_head // T) * cfg.block_size * head_dim * 4
    # dp_shard x cp: FSDP on the TP-local units, rows padded to a multiple of S x C; the root gathered
    # once (kept for backward), each block twice, one reduce-scatter each; the norm's squares, one a tensor
    n = S * C
    units = tp_local_units(T)
    padded = [sum(math.ceil(s[0] / n) * n * math.prod(s[1:]) for s in unit) for unit in units]
    gathers = [1] + [2] * (len(units) - 1)
    shard = sum(4 * size * (g + 1) * (n - 1) / n for size, g in zip(padded, gathers))
    shard += 4 * sum(len(unit) for unit in units) * ring(n)
    replicate = sum(4 * size / n * ring(R) for size in padded)
    return {"tp": round(tp), "cp": round(cp), "dp_shard_cp": round(shard), "dp_replicate": round(replicate)}


def check_two_nodes(folder: Path) -> dict:
    """The check of both layouts, 2 steps each, on two "nodes" of four: on the suite's second lane
    (tests/background.py), from collection on; the tests that read it run last."""
    path = folder / "lab07.json"
    two_nodes(["--check", "--steps", "2", "--quiet", "--report", str(path)], 540, "lab/07_nd_parallel.py", 4)
    return json.loads(path.read_text())


def submit(config: pytest.Config) -> Future:
    return background.launch(config, "lab07_check", "lab07 check on two nodes of four", check_two_nodes)


@pytest.fixture(scope="module")
def lab07_check(request) -> dict:
    return submit(request.config).result(timeout=limit(900))


def test_both_layouts_pass_the_rulers_on_two_nodes_of_four(lab07_check):
    r = lab07_check
    assert r["criterion_pass"] and r["world_size"] == 8, r.get("broken_rulers")
    assert set(proof.REPORT_KEYS) <= set(r), sorted(r)
    assert list(r["layouts"]) == ["2 x 2 x 1 x 2", "1 x 2 x 2 x 2"]
    assert r["fp64_max_step_drift"] <= 1e-12, r["fp64_max_step_drift"]
    assert r["fp32_first_step_logit_diff"] <= 1e-5 and r["fp32_first_step_grad_diff"] <= 1e-5, r
    assert r["ranks_bit_identical"], {k: v["ranks_bit_identical"] for k, v in r["layouts"].items()}
    # Exercise 7.3's join, run by the lab on every rank: every sharded parameter of MiniGPT (its 4 blocks'
    # 10 each, the embedding, the position embedding, the final norm's 2) from every rank's pieces
    for name, layout in r["layouts"].items():
        assert layout["whole_from_pieces"] == {"parameters": 4 * 10 + 4, "bit_identical_every_rank": True}, name


def test_the_groups_follow_from_the_coordinates_tp_innermost(lab07_check):
    report = lab07_check
    groups = report["layouts"]["2 x 2 x 1 x 2"]["groups"]
    assert groups["tp"] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert groups["dp_shard"] == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert groups["dp_replicate"] == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert groups["cp"] == [[r] for r in range(8)]
    cp = report["layouts"]["1 x 2 x 2 x 2"]["groups"]
    assert cp["cp"] == [[0, 2], [1, 3], [4, 6], [5, 7]] and cp["dp_shard"] == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert cp["dp_shard_cp"] == [[0, 2, 4, 6], [1, 3, 5, 7]]


@pytest.mark.parametrize("layout", [HSDP_TP, FSDP_CP_TP], ids=["hsdp-tp", "fsdp-cp-tp"])
def test_the_bytes_of_every_dimension_are_the_count_by_hand(lab07_check, layout):
    report = lab07_check
    found = report["layouts"][" x ".join(map(str, layout))]
    expected = expected_bytes(layout)
    assert found["bytes_per_dim"] == found["bytes_model_per_dim"] == expected, (found["bytes_per_dim"], expected)
    assert found["bytes_every_rank_equal_model"] and found["bytes_constant_over_steps"], found
    # model states after the step: weights, gradients and AdamW's two moments of this rank's shard of
    # every TP-local tensor (4 + 4 + 8 bytes an element), and AdamW's float32 step count per tensor
    R, S, C, T = layout
    units = tp_local_units(T)
    elements = sum(math.ceil(s[0] / (S * C)) * (S * C) * math.prod(s[1:]) for unit in units for s in unit)
    states = 16 * elements // (S * C) + 4 * sum(len(unit) for unit in units)
    memory = found["memory_per_rank"]
    assert memory["measured"] == memory["model"] == states and set(memory["every_rank"]) == {states}, memory


# ----------------------------------------------------------------------------------------------
# the pipeline dimension: pp 2 x dp 2 x tp 2 on 8 ranks


def check_pipeline(folder: Path) -> dict:
    """``--pp 2`` on 8 ranks (pp 2 x dp 2 x tp 2), 2 steps, forked as torchrun's would be
    (``launcher.run_script``; the script's torchrun launch is the two-node one above): on the lane."""
    path = folder / "lab07-pp.json"
    args = ["lab/07_nd_parallel.py", "--check", "--pp", "2", "--steps", "2", "--quiet", "--report", str(path)]
    done = launcher.run_script(args, 8, limit(400))
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(path.read_text())


def submit_pipeline(config: pytest.Config) -> Future:
    return background.launch(config, "lab07_pp_check", "lab07 --pp 2 on 8 ranks", check_pipeline)


@pytest.fixture(scope="module")
def lab07_pp_check(request) -> dict:
    return submit_pipeline(request.config).result(timeout=limit(900))


def pipeline_by_hand() -> tuple[dict[str, int], int]:
    """Rank 0 of pp 2 x dp 2 x tp 2 (stage 0: the embeddings and blocks 0 and 1, cut over tp 2): its
    bytes along each dimension in one float32 step, and its model states after the step."""
    cfg = TrainConfig()
    C, T, V, rows = cfg.n_embd, cfg.block_size, GPTConfig().vocab_size, cfg.batch_size // 2
    activations = rows * T * C * 4
    shapes = [(V, C), (T, C)] + [s for block in tp_local_units(2)[1:3] for s in block]
    elements = sum(math.prod(s) for s in shapes)
    bytes_ = {
        "pp": activations + V * C * 4 + 8,  # activations down, the tied matrix's half, the norm's 2 numbers
        "dp": 4 * (elements + elements % 2),  # the all-reduce of every gradient, padded to 2
        "tp": 4 * 2 * activations + 8,  # 4 all-reduces a block, 2 blocks; the norm's squares
    }
    return bytes_, 16 * elements + 4 * len(shapes)  # weights, gradients, AdamW's 2 moments; a counter each


def test_the_pipeline_dimension_passes_the_rulers_with_bytes_counted_by_hand(lab07_pp_check):
    """pp 2 x dp 2 x tp 2: Lab 06's stages with Lab 05's TP blocks, the replicas averaging. Rank 0 is
    stage 0 (the embeddings and blocks 0 and 1, cut over tp 2): its bytes along each dimension from
    MiniGPT's shapes, the batch and the ring factor of 2 ranks (each all-reduce sends its buffer once)."""
    r = lab07_pp_check
    assert r["criterion_pass"] and set(proof.REPORT_KEYS) <= set(r), r.get("broken_rulers")
    assert r["fp64_max_step_drift"] <= 1e-12 and r["fp32_first_step_grad_diff"] <= 1e-5, r
    assert r["same_as_pytorch"] is None and "pipelining" in r["pytorch_impl_reason"], r["pytorch_impl_reason"]
    layout = r["layouts"]["pp 2 x dp 2 x tp 2"]
    assert layout["groups"] == {
        "pp": [[0, 4], [1, 5], [2, 6], [3, 7]],
        "dp": [[0, 2], [1, 3], [4, 6], [5, 7]],
        "tp": [[0, 1], [2, 3], [4, 5], [6, 7]],
    }
    expected, states = pipeline_by_hand()
    assert layout["bytes_per_dim"] == layout["bytes_model_per_dim"] == expected, (layout["bytes_per_dim"], expected)
    assert layout["bytes_every_rank_equal_model"] and layout["bytes_constant_over_steps"], layout
    memory = layout["memory_per_rank"]
    assert memory["measured"] == memory["model"] == states, memory
    assert memory["every_rank_equal_model"] and layout["ranks_bit_identical"], layout
