"""The proof harness (minigpt/parallel/proof.py) measured on systems broken on purpose: each ruler
breaks when its rule is broken, and says so in one line that names it.

tests/proof_cases.py runs, in one process (a world of one), MiniGPT as a system that computes what
one process computes (every drift exactly 0: the harness adds nothing of its own), and with two
classic mistakes put into the gradients by hand: DDP's sum never divided by the world size (SGD,
so that no optimizer hides a scale), and a reduce forgotten for one parameter. The end-to-end
case, a lab script exiting 1 on a learner's mistake, is in tests/test_lab04_reference.py.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.launcher import ROOT
from tests.limits import limit


@pytest.fixture(scope="module")
def cases(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("proof") / "cases.json"
    proc = subprocess.run(
        [sys.executable, "tests/proof_cases.py", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=limit(180),
        env={"PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(out.read_text())


def test_the_same_computation_measures_zero_on_every_ruler(cases):
    honest = cases["honest"]
    for key in (
        "fp64_max_step_drift",
        "fp32_first_step_logit_diff",
        "fp32_first_step_grad_diff",
        "fp32_max_step_drift",
    ):
        assert honest[key] == 0.0, (key, honest[key])
    assert honest["criterion_pass"] and honest["lines"][-1] == "check PASS: all 4 criteria hold"


@pytest.mark.parametrize("case", ["doubled_sgd", "one_lost"])
def test_a_wrong_gradient_breaks_the_float64_ruler_by_orders_of_magnitude(cases, case):
    """A wrong scale or a missing reduce moves float64 logits by 1e-2 and more, where the algorithm
    itself gives 1e-13 or less: the float64 ruler sees any real bug."""
    found = cases[case]
    assert found["fp64_max_step_drift"] > 1e6 * 1e-9 and found["fp32_first_step_grad_diff"] > 1e-3, found
    assert not found["criterion_pass"]
    assert set(found["broken_rulers"]) == {"fp64_max_step_drift", "fp32_first_step_grad_diff", "fp32_max_step_drift"}
    assert any(line.startswith("broken ruler fp64_max_step_drift: measured ") for line in found["lines"])
    assert found["fp32_first_step_logit_diff"] == 0.0  # the forward is right: only the gradients are wrong


def test_a_broken_equality_names_its_ruler_and_both_values(cases):
    v = cases["verdict"]
    assert v["broken_rulers"] == ["bytes_per_rank_per_step", "same_as_pytorch"] and not v["criterion_pass"]
    assert "broken ruler bytes_per_rank_per_step: measured 2,922,000, criterion = 2,922,240" in v["lines"]
    assert "broken ruler same_as_pytorch: measured false, criterion must be true" in v["lines"]
    assert any(line.startswith("reported pytorch_fp32_max_step_drift: 1.20e-04") for line in v["lines"])


def test_a_check_of_several_parts_keeps_each_rulers_worst_part():
    """``proof.combined``: two layouts' proofs as one check's keys (Labs 02, 06, 07): each drift the
    worse of the two, each step count the fewer, the float32 run the worse layout's, or the named part's."""
    from minigpt.parallel import proof

    def part(fp64, logits, grads, fp32, worst_step, norm, steps):
        return {
            "fp64_max_step_drift": fp64,
            "fp64_steps": steps,
            "fp32_first_step_logit_diff": logits,
            "fp32_first_step_grad_diff": grads,
            "fp32_max_step_drift": fp32,
            "fp32_worst_step": worst_step,
            "fp32_steps": steps,
            "fp32_norm_rel_diff": norm,
            "fp32_twin_clips_with": "run",
        }

    hsdp, dp_tp = part(3e-14, 2e-7, 5e-7, 4e-7, 12, 1e-7, 20), part(8e-14, 1e-7, 9e-7, 6e-6, 3, 4e-8, 24)
    assert proof.combined([hsdp, dp_tp]) == {
        "fp64_max_step_drift": 8e-14,
        "fp64_steps": 20,
        "fp32_first_step_logit_diff": 2e-7,
        "fp32_first_step_grad_diff": 9e-7,
        "fp32_max_step_drift": 6e-6,
        "fp32_worst_step": 3,
        "fp32_steps": 20,
        "fp32_norm_rel_diff": 1e-7,
        "fp32_twin_clips_with": "run",
    }
    named = proof.combined([hsdp, dp_tp], float32=hsdp)
    assert (named["fp32_max_step_drift"], named["fp32_worst_step"], named["fp32_steps"]) == (4e-7, 12, 20)
    assert named["fp32_first_step_grad_diff"] == 9e-7  # the first step's rulers stay the worst part's


def test_the_model_parallel_family_is_held_to_pytorch_by_both_rules():
    """``close_to_pytorch``: the one-step logits within 1e-6 of PyTorch's, and the drift within 1e-5 or
    twice PyTorch's on the same run; either broken, the comparison fails."""
    from minigpt.parallel.bounds import close_to_pytorch

    assert close_to_pytorch(5e-7, 9e-6, 1e-7)  # under the course's 1e-5
    assert close_to_pytorch(5e-7, 3.9e-5, 2e-5)  # over 1e-5, under twice PyTorch's
    assert not close_to_pytorch(5e-7, 4.1e-5, 2e-5)  # over twice PyTorch's
    assert not close_to_pytorch(1.1e-6, 1e-7, 1e-7)  # the first step's logits too far


def test_several_layouts_are_the_same_as_pytorch_only_when_each_is():
    """``proof.against_pytorch`` (Labs 05-07): each difference the worst layout's, and one layout far
    from PyTorch's composition is enough to say no, even when another layout's numbers cover it."""
    from minigpt.parallel import proof

    def layout(logits, drift, theirs):
        return {
            "pytorch_first_step_logit_diff": logits,
            "fp32_max_step_drift": drift,
            "pytorch_fp32_max_step_drift": theirs,
        }

    close, far = layout(4e-7, 3e-5, 2e-5), layout(2e-7, 3.5e-5, 1e-5)  # far: 3.5e-5 > max(1e-5, 2 x 1e-5)
    assert proof.against_pytorch([close]) == {
        "pytorch_first_step_logit_diff": 4e-7,
        "pytorch_max_diff": 4e-7,
        "pytorch_fp32_max_step_drift": 2e-5,
        "same_as_pytorch": True,
    }
    both = proof.against_pytorch([close, far])
    # the worst drift (3.5e-5) is under twice the worst PyTorch drift (2e-5): only each layout on its own says no
    assert both == {
        "pytorch_first_step_logit_diff": 4e-7,
        "pytorch_max_diff": 4e-7,
        "pytorch_fp32_max_step_drift": 2e-5,
        "same_as_pytorch": False,
    }
