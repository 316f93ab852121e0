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
