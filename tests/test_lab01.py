"""Lab 01 · DDP from scratch: the graded checks.

The multi-process scenarios run once per session in a single launch (the ``ranks`` fixture of
tests/ranks.py, tests/dist_worker.py): 4 ranks for the ring, 2 for the DDP; each test below reads
what the ranks measured, in the scenario run for its exercise (``ddp_toy@1.3``: only Exercise 1.3
the learner's). The bucket assignment is a plain function and is tested in this process. The
course's own checks of the reference are in tests/test_lab01_reference.py.

    make grade EX=1.3          # or: .venv/bin/python -m minigpt.grader --exercise 1.3
"""

from __future__ import annotations

import pytest
from torch import nn

from minigpt import impl
from tests.limits import limit
from tests.ranks import Launch, scenario
from tests.words import say

pytestmark = [pytest.mark.lab("01"), pytest.mark.timeout(180)]


def both(ranks: Launch, name: str) -> list[dict]:
    return [scenario(ranks, name, r) for r in range(2)]


# ----------------------------------------------------------------------------------------------
# Exercise 1.1: the ring all-reduce


def ring_cases(ranks, size):
    return [(r, c) for r in range(size) for c in scenario(ranks, f"ring_{size}", r)["cases"]]


@pytest.mark.exercise("1.1")
@pytest.mark.points(1)
@pytest.mark.parametrize("size", [2, 3, 4])
def test_ring_sum_matches_torch(ranks, size):
    for rank, case in ring_cases(ranks, size):
        if case["op"] != "sum":
            continue
        where = f"rank {rank}, length {case['length']}"
        assert case["returned_input"], f"{where}: return the tensor you reduced in place"
        assert case["integer_exact"], f"{where}: integer-valued input must sum exactly"
        assert case["max_error"] <= 1e-5, f"{where}: differs from dist.all_reduce by {case['max_error']:.2e}"


@pytest.mark.exercise("1.1")
@pytest.mark.points(1)
def test_ring_average_and_a_world_of_one(ranks):
    for size in (1, 2, 3, 4):
        for rank, case in ring_cases(ranks, size):
            where = f"world size {size}, rank {rank}, op {case['op']}, length {case['length']}"
            assert case["max_error"] <= 1e-5 and case["integer_exact"], where


@pytest.mark.exercise("1.1")
@pytest.mark.points(2)
def test_ring_sends_chunks_not_the_whole_tensor(ranks):
    """Bytes sent per rank: 2(N-1)/N of the tensor (exactly, up to the uneven chunks). A ring
    that passes whole tensors costs the same for 2 ranks and is caught from 3 on."""
    for size in (2, 3, 4):
        for rank, case in ring_cases(ranks, size):
            assert case["bytes_sent"] == case["bytes_expected"], (
                f"world size {size}, rank {rank}, {case['length']} floats: sent {case['bytes_sent']} bytes, "
                f"a ring sends {case['bytes_expected']} (2(N-1)/N x {4 * case['length']} = {case['bytes_formula']:.0f})"
            )


@pytest.mark.exercise("1.1")
@pytest.mark.points(1)
def test_ring_leaves_every_rank_with_the_same_bits(ranks):
    for size in (2, 3, 4):
        digests = [[c["digest"] for c in scenario(ranks, f"ring_{size}", r)["cases"]] for r in range(size)]
        assert all(d == digests[0] for d in digests), f"world size {size}: ranks disagree"


@pytest.mark.exercise("1.1")
@pytest.mark.points(1)
def test_ring_rejects_an_unknown_op(ranks):
    result = scenario(ranks, "ring_bad_op", 0)
    assert result["raised"] and "max" in result["message"], "op='max' must raise a ValueError that names it"


# ----------------------------------------------------------------------------------------------
# Exercise 1.2: buckets (in this process)


@pytest.fixture
def assign_buckets(impl_name):
    return impl.load("lab01_ddp", "assign_buckets", impl_name)


def names(buckets) -> list[list[str]]:
    return [[name for name, _ in bucket] for bucket in buckets]


def stack() -> nn.Sequential:
    # parameter bytes in registration order: 0.weight 64, 0.bias 16, 1.weight 64, 1.bias 16, 2.weight 64, 2.bias 16
    return nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4), nn.Linear(4, 4))


@pytest.mark.exercise("1.2")
@pytest.mark.points(2)
def test_buckets_reverse_order_up_to_the_cap(assign_buckets):
    assert names(assign_buckets(stack(), 80)) == [
        ["2.bias", "2.weight"],
        ["1.bias", "1.weight"],
        ["0.bias", "0.weight"],
    ]
    assert names(assign_buckets(stack(), 100)) == [["2.bias", "2.weight", "1.bias", "1.weight"], ["0.bias", "0.weight"]]
    assert names(assign_buckets(stack(), 10_000)) == [
        ["2.bias", "2.weight", "1.bias", "1.weight", "0.bias", "0.weight"]
    ]
    buckets = assign_buckets(stack(), 80)
    assert all(isinstance(p, nn.Parameter) for bucket in buckets for _, p in bucket)


@pytest.mark.exercise("1.2")
@pytest.mark.points(1)
def test_buckets_close_when_they_reach_the_cap(assign_buckets):
    """A bias (16 bytes) below a 20-byte cap waits for the weight after it: no message of 16 bytes."""
    assert names(assign_buckets(stack(), 20)) == [
        ["2.bias", "2.weight"],
        ["1.bias", "1.weight"],
        ["0.bias", "0.weight"],
    ]
    assert names(assign_buckets(stack(), 10)) == [
        ["2.bias"],
        ["2.weight"],
        ["1.bias"],
        ["1.weight"],
        ["0.bias"],
        ["0.weight"],
    ]


@pytest.mark.exercise("1.2")
@pytest.mark.points(2)
def test_buckets_skip_frozen_and_hold_tied_weights_once(assign_buckets):
    from tests.dist_worker import Toy  # embed.weight is head.weight; frozen.* do not train

    layout = names(assign_buckets(Toy(), 200))
    flat = [n for bucket in layout for n in bucket]
    assert not any(n.startswith("frozen.") for n in flat), f"frozen parameters have no gradient: {flat}"
    assert flat.count("embed.weight = head.weight") == 1 and "head.weight" not in flat, flat
    assert layout == [["out.bias", "out.weight"], ["hidden.bias", "hidden.weight"], ["embed.weight = head.weight"]]


# ----------------------------------------------------------------------------------------------
# Exercise 1.3: the hook and the asynchronous launch


@pytest.mark.exercise("1.3")
@pytest.mark.points(2)
def test_ddp_gradients_are_the_average_over_ranks(ranks):
    for r, result in enumerate(both(ranks, "ddp_toy@1.3")):
        assert result["module_is_model"] and result["same_start_as_rank0"]
        assert result["grad_error"] <= 1e-6, (
            f"rank {r}: gradients differ from the average by {result['grad_error']:.2e}"
        )
        assert result["frozen_grad_is_none"], f"rank {r}: a frozen parameter got a gradient"


@pytest.mark.exercise("1.3")
@pytest.mark.points(1)
def test_ddp_all_reduce_starts_during_backward(ranks):
    """Overlap: the first bucket is launched before the last bucket's gradients exist."""
    for r, result in enumerate(both(ranks, "ddp_toy@1.3")):
        first, last = result["timeline"][0], result["timeline"][-1]
        assert first["launched_s"] is not None and last["last_ready_s"] is not None, f"rank {r}: no timings"
        assert first["launched_s"] < last["last_ready_s"], (
            f"rank {r}: bucket 0 was launched at {first['launched_s']:.6f} s, after the last gradient "
            f"({last['last_ready_s']:.6f} s): launch each bucket from the hook as soon as it is full"
        )


@pytest.mark.exercise("1.3")
@pytest.mark.points(1)
def test_ddp_launches_buckets_in_the_same_order_on_every_rank(ranks):
    """Gradients arrive in opposite orders on the two ranks; the buckets must not."""
    for r, result in enumerate(both(ranks, "ddp_bucket_order@1.3")):
        assert result["a_grad"] == [20.0] * 3 and result["b_grad"] == [6.0] * 5, f"rank {r}: {result}"


@pytest.mark.exercise("1.3")
@pytest.mark.points(1)
def test_ddp_no_sync_accumulates_locally(ranks):
    for r, result in enumerate(both(ranks, "ddp_no_sync@1.3")):
        assert result["stayed_local"] == 0.0, f"rank {r}: gradients were synchronised inside no_sync()"
        assert result["accumulated_error"] <= 1e-6, f"rank {r}: the next synced backward must average the sum"
        assert result["forward_decides"] == 0.0, f"rank {r}: a forward run inside no_sync must not sync its backward"


@pytest.mark.exercise("1.3")
@pytest.mark.points(1)
def test_ddp_ring_switch_gives_the_same_gradients(ranks):
    for r, (ring, torch_) in enumerate(zip(both(ranks, "ddp_ring@1.3"), both(ranks, "ddp_toy@1.3"))):
        assert ring["grad_error"] <= 1e-6, f"rank {r}: the ring-reduced gradients are off by {ring['grad_error']:.2e}"
        assert ring["ring_bytes_sent"] == torch_["bytes_all_reduced"], "2 ranks: the ring sends one buffer's worth"


# ----------------------------------------------------------------------------------------------
# Exercise 1.4: wait and unflatten


@pytest.mark.exercise("1.4")
@pytest.mark.points(1)
def test_ddp_finish_counts_bytes_and_is_harmless_twice(ranks):
    for r, result in enumerate(both(ranks, "ddp_toy@1.4")):
        assert result["bytes_all_reduced"] == 896, f"rank {r}: 224 trainable floats = 896 bytes per step"
        assert result["finish_twice_harmless"], f"rank {r}: a second finish_gradient_synchronization() changed .grad"


@pytest.mark.exercise("1.4")
@pytest.mark.points(1)
def test_ddp_unused_parameter_is_an_error_that_names_it(ranks):
    for r, result in enumerate(both(ranks, "ddp_unused@1.4")):
        assert result["raised"], f"rank {r}: a parameter without gradient must raise RuntimeError"
        assert "forgotten.weight" in result["message"], f"rank {r}: name the parameter: {result['message']}"
        assert result["seconds"] < limit(5), f"rank {r}: took {result['seconds']:.1f} s: raise, do not wait"


# ----------------------------------------------------------------------------------------------
# All together: your DDP on your ring trains MiniGPT as one process does


@pytest.mark.exercise("all")
@pytest.mark.points(2)
def test_ddp_minigpt_two_ranks_equal_one_process(ranks):
    """All four exercises at once (``collective="ring"``): the averaged gradients of one backward,
    then three AdamW steps. AdamW would hide gradients summed instead of averaged (it divides by
    the gradient's own size), so the gradients are compared first."""
    r0, r1 = both(ranks, "ddp_minigpt@all")
    for r, result in enumerate((r0, r1)):
        assert result["grad_error"] <= 1e-6, say(
            f"rank {r}: after one backward the gradients differ from one process's by {result['grad_error']:.2e} "
            "(expected <= 1e-6): is each bucket divided by the world size?",
            f"rank {r}: tras un backward los gradientes difieren de los de un proceso en {result['grad_error']:.2e} "
            "(se espera <= 1e-6): ¿se divide cada cubeta por el tamaño del mundo?",
        )
    assert r0["buckets"] > 1
    drift = max(r0["drifts"] + r1["drifts"])
    assert drift <= 1e-5, say(
        f"after 3 steps the logits differ from one process's by {drift:.2e} (expected <= 1e-5)",
        f"tras 3 pasos los logits difieren de los de un proceso en {drift:.2e} (se espera <= 1e-5)",
    )
    assert r0["digests"] == r1["digests"], say(
        "the two ranks' parameters differ after a step (expected: the same bits)",
        "los parámetros de los dos ranks difieren tras un paso (se espera: los mismos bits)",
    )
