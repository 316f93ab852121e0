"""Lab 05's two scripts (the course's own checks, no points): lab/05_tensor_parallel.py --check
(short, with sequence parallelism) on 2 ranks and lab/05_ring_attention.py --check on 4 (on the
suite's second lane), each as torchrun's ranks without its agent (``launcher.run_script``). Each report is held against numbers this file computes
itself: theory page 02's byte formulas, the parameter count of a MiniGPT cut by hand.
"""

from __future__ import annotations

import json
from concurrent.futures import Future
from pathlib import Path

import pytest

from minigpt.model import GPTConfig, MiniGPT
from minigpt.parallel import proof
from minigpt.zero import analytic as za
from tests import background, launcher
from tests.limits import limit

pytestmark = pytest.mark.timeout(300)


def run(args: list[str], nproc: int, timeout_s: float) -> str:
    """The lab script on ``nproc`` ranks as torchrun starts them, without its agent (one torch import
    less; ``launcher.run_script``): notebook 05 runs both scripts under torchrun, as a learner does."""
    done = launcher.run_script(args, nproc, limit(timeout_s))
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def parameter_bytes_per_rank(tp: int) -> int:
    """Bytes of the parameters one rank of tp holds: the vocabulary padded to a multiple of tp and
    cut; every matrix of attention and the MLP, and the MLP's first bias, cut; the rest whole."""
    cfg = GPTConfig()
    total = 0
    for name, p in MiniGPT(cfg).named_parameters():
        if name == "wte.weight":
            total += -(-cfg.vocab_size // tp) * p.shape[1]
        elif name.endswith(("qkv.weight", "attn.proj.weight", "fc.weight", "fc.bias", "mlp.proj.weight")):
            total += p.numel() // tp
        else:
            total += p.numel()
    return 4 * total


def test_the_tensor_parallel_script_passes_its_check(tmp_path):
    """Two ranks, sequence parallelism, 6 steps: one step equals one process (float32 and float64,
    with and without SP), the bytes equal the formula, the parameters the count, and the step
    drift stays within Lab 01's criterion over these early steps."""
    report = tmp_path / "tp.json"
    args = ["lab/05_tensor_parallel.py", "--check", "--sequence-parallel", "--steps", "6"]
    run([*args, "--test-sentences", "5", "--quiet", "--report", str(report)], 2, 240)
    r = json.loads(report.read_text())
    keys = ("world_size", "tp", "bytes_per_rank_per_step", "bytes_model", "pytorch_fp32_max_step_drift")
    assert all(k in r for k in (*keys, *proof.REPORT_KEYS)), sorted(r)
    cfg, (batch, seq) = GPTConfig(), (64, 32)
    per_layer = za.tensor_parallel_bytes_per_layer(seq, batch, cfg.n_embd, 2, bytes_per_element=4)
    formula = cfg.n_layer * per_layer + (2 * batch * seq * cfg.n_embd + 3 * batch * seq) * 4  # ring: 2(N-1)/N = 1
    assert r["criterion_pass"] and r["world_size"] == r["tp"] == 2 and r["sequence_parallel"], r
    assert r["bytes_per_rank_per_step"] == r["bytes_model"] == formula, (r["bytes_per_rank_per_step"], formula)
    one = r["one_step"]
    assert one["float32"]["tp"]["bytes_sent"] == one["float32"]["sp"]["bytes_sent"] == formula
    assert one["float32"]["tp"]["param_bytes"] == parameter_bytes_per_rank(2), one["float32"]["tp"]
    assert r["fp32_first_step_logit_diff"] <= 1e-5 and r["fp32_first_step_grad_diff"] <= 1e-5, r
    assert max(one["float64"][m]["max_grad_diff"] for m in ("tp", "sp")) <= 1e-12, one["float64"]
    assert r["fp64_max_step_drift"] <= 1e-12 and r["fp64_steps"] == 6, r
    # PyTorch's own TP (parallelize_module) on the same weights: the same logits, and no closer to one
    # process over these steps than ours within the factor the harness allows
    assert r["pytorch_first_step_logit_diff"] <= 1e-6 and r["same_as_pytorch"], r
    assert r["replicated_bit_identical"], r
    # sequence parallelism keeps fewer activations for backward than tensor parallelism alone
    assert one["float32"]["sp"]["saved_activation_bytes"] < one["float32"]["tp"]["saved_activation_bytes"], one


def run_ring_check(folder: Path) -> dict:
    """lab/05_ring_attention.py --check on four ranks, its report: on the suite's second lane
    (tests/background.py), from collection on; the test that reads it runs last."""
    report = folder / "ring.json"
    args = ["lab/05_ring_attention.py", "--check", "--check-steps", "3", "--fp64-steps", "20", "--seq-lens", "32", "64"]
    run([*args, "--report", str(report)], 4, 240)
    return json.loads(report.read_text())


def submit(config: pytest.Config) -> Future:
    return background.launch(config, "ring_check", "lab05 ring attention check", run_ring_check)


@pytest.fixture(scope="module")
def ring_check(request) -> dict:
    return submit(request.config).result(timeout=limit(600))


def test_the_ring_attention_script_passes_its_check_on_four_ranks(ring_check):
    """Four ranks: every length and layout equals full attention; each rank sends (cp-1)/cp of K
    and V forward and again backward; the balanced split gives every rank the same useful scores;
    lengths the split cannot cut are refused."""
    r = ring_check
    assert r["criterion_pass"] and r["world_size"] == 4, r
    assert all(k in r for k in proof.REPORT_KEYS) and r["pytorch_impl"] is None and "CUDA" in r["pytorch_impl_reason"]
    assert r["fp64_max_step_drift"] <= 1e-12 and r["training"]["bytes_sent_per_step"] == r["bytes_model_per_step"], r
    batch, heads, head_dim = r["shape"]["batch"], r["shape"]["heads"], r["shape"]["head_dim"]
    for case in r["cases"]:
        size = 4 if case["dtype"] == "float32" else 8
        expected = 3 * 2 * batch * heads * case["seq_len"] * head_dim * size // 4
        assert case["bytes_forward"] == case["bytes_backward"] == [expected] * 4, case
        assert case["max_out_diff"] <= (1e-5 if size == 4 else 1e-12), case
        needed = case["scores_needed"]
        if case["load_balanced"]:
            assert len(set(needed)) == 1, case
        else:  # contiguous: the last rank needs the most, rank 0 the least
            assert needed == sorted(needed) and needed[0] < needed[-1], case
    assert r["bytes_per_rank"] == r["bytes_model"]
    assert all(message and "not divisible" in message for message in r["refused"].values()), r["refused"]
