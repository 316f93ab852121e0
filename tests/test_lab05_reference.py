"""Lab 05: the course's own checks of tensor, sequence and context parallelism written by hand
(no points; ``make grade`` never runs them). One launch of tests/tp_worker.py at 2 ranks and one at
4 (tp = cp = the world size); every number the worker measured is held here against a reference
this file computes itself: one process's logits and gradients (computed on every rank from the same
seed), full causal attention, and the byte formulas of theory page 02.
"""

from __future__ import annotations

import pytest

from minigpt.model import GPTConfig
from minigpt.zero import analytic as za

pytestmark = pytest.mark.timeout(180)

BATCH, SEQ = 4, 32  # tests/tp_worker.py's batch
TOLERANCE = {"float32": 1e-5, "float64": 1e-12}
SIZE = {"float32": 4, "float64": 8}


@pytest.fixture(scope="module", params=[2, 4])
def ranks(request, tmp_path_factory):
    """tests/tp_worker.py on 2 and on 4 ranks: (world, each rank's results)."""
    from tests.launcher import ROOT, run_ranks
    from tests.limits import limit

    out = tmp_path_factory.mktemp(f"tp-{request.param}")
    results, errors = run_ranks(ROOT / "tests" / "tp_worker.py", request.param, out, timeout_s=limit(120))
    for rank in range(request.param):
        assert results[rank].get("finished"), f"rank {rank} did not finish: {errors[rank][-800:]}"
    return request.param, results


def every(ranks, name):
    world, results = ranks
    for rank in range(world):
        result = results[rank][name]
        assert result["ok"], result
        yield world, result


def expected_tp_bytes(world: int, dtype: str) -> float:
    """Theory page 02: per layer V_TP (za.tensor_parallel_bytes_per_layer, the page's own function),
    plus the all-reduce of the token embedding (forward) and of the output layer's input (backward),
    each of b s h, and the loss's all-reduces of b s (maximum) and 2 b s (sum of exponentials, target)."""
    cfg = GPTConfig()
    e = SIZE[dtype]
    ring = 2 * (world - 1) / world
    layers = cfg.n_layer * za.tensor_parallel_bytes_per_layer(SEQ, BATCH, cfg.n_embd, world, bytes_per_element=e)
    return layers + ring * (2 * BATCH * SEQ * cfg.n_embd * e + 3 * BATCH * SEQ * e)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_tensor_parallel_equals_one_process(ranks, dtype):
    """Logits, loss and every gradient of TPMiniGPT (MiniGPT's names, the tied matrix once) equal
    one process's; the model built from MiniGPT gathers back to it exactly; each rank holds
    ceil(609 / tp) vocabulary rows (609 padded to a multiple of tp)."""
    for rank, (world, result) in enumerate(every(ranks, f"tp-{dtype}")):
        for mode in ("tp", "sp"):
            r = result[mode]
            assert r["built_exact"] and r["grad_keys"] == [], r
            assert r["local_vocab"] == -(-609 // world), r
            last = world - 1
            padding = world * r["local_vocab"] - 609 if rank == last else 0
            assert r["padding_rows"] == padding and r["padding_grad"] == 0.0, r
            for key in ("logits", "loss", "grads"):
                assert r[key] <= TOLERANCE[dtype], (mode, key, r)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_sequence_parallel_equals_tensor_parallel_and_sends_the_same_bytes(ranks, dtype):
    for world, result in every(ranks, f"tp-{dtype}"):
        assert result["sp_vs_tp"]["logits"] <= TOLERANCE[dtype], result["sp_vs_tp"]
        assert result["sp_vs_tp"]["grads"] <= TOLERANCE[dtype], result["sp_vs_tp"]
        assert result["sp"]["bytes"] == result["tp"]["bytes"], result
        # sequence parallelism's once-a-step gradient all-reduce: the position embedding, ln_f, and
        # per block ln_1, ln_2 (weights and biases) and the MLP's row-parallel bias
        cfg = GPTConfig()
        elements = cfg.block_size * cfg.n_embd + 2 * cfg.n_embd + cfg.n_layer * 5 * cfg.n_embd
        assert result["sp"]["grad_sync_bytes"] == 2 * (world - 1) / world * elements * SIZE[dtype], result
        assert result["tp"]["grad_sync_bytes"] == 0, result


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_bytes_per_step_equal_the_formula(ranks, dtype):
    from minigpt.parallel.tensor_parallel import tp_bytes_per_step

    for world, result in every(ranks, f"tp-{dtype}"):
        expected = expected_tp_bytes(world, dtype)
        assert result["tp"]["bytes"] == expected, (result["tp"]["bytes"], expected)
        assert tp_bytes_per_step(BATCH, SEQ, 96, 4, world, SIZE[dtype]) == expected


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_ring_attention_equals_full_causal_attention(ranks, dtype):
    """cp = 2 and 4, T = 8, 24, 32, contiguous and load-balanced slices: this rank's output and
    gradients equal full attention's; forward sends (cp-1)/cp of K and V in cp-1 transfers, and
    backward (the gradient blocks, back round the ring) as many bytes."""
    for rank, (world, result) in enumerate(every(ranks, f"ring-{dtype}")):
        cases = {k: v for k, v in result.items() if k != "ok"}
        assert len(cases) == 6, sorted(cases)
        for name, case in cases.items():
            for key in ("out", "merged_out", "grads"):
                assert case[key] <= TOLERANCE[dtype], (name, key, case)
            b, h, t, d = case["shape"]
            kv_bytes = 2 * b * h * t * d * case["element_size"]
            assert case["forward_bytes"] == (world - 1) / world * kv_bytes, (name, case)
            assert case["backward_bytes"] == case["forward_bytes"], (name, case)
            assert case["messages"] == 2 * (world - 1), (name, case)
            # the block pairs multiplied: own block first; contiguous slices skip every later rank's
            # block (rank r meets r+1 blocks), load-balanced ones skip none (each rank has an early
            # chunk and a late one)
            ring_order = [(rank - j) % world for j in range(world)]
            expected = ring_order if name.endswith("balanced") else ring_order[: rank + 1]
            assert case["computed"] == expected, (name, case["computed"], expected)


def test_bad_input_is_refused_naming_the_values(ranks):
    for world, result in every(ranks, "refusals"):
        assert "609" in result["vocab"] and f"tp={world}" in result["vocab"], result
        heads = 3 if world == 2 else 6
        assert f"{heads} attention heads" in result["heads"] and f"tp={world}" in result["heads"], result
        assert "T=31" in result["sequence"] and f"tp={world}" in result["sequence"], result
        assert "T=9" in result["cp_split"] and f"cp={world}" in result["cp_split"], result
        assert "T=6" in result["cp_split_balanced"] and f"cp={world}" in result["cp_split_balanced"], result
