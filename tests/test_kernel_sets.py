"""The CPU matrix: Lab 01's drift check under every kernel set this machine supports (ATen, MKL and
oneDNN held together at AVX-512, at AVX2 and at their baseline), so that a number that depends on
the CPU is caught here, not by a learner.

One two-rank launch per kernel set of ``lab/01_ddp.py --check`` on a short schedule (12 steps,
warm-up 4: AdamW's first steps, where it amplifies most, at the peak learning rate). The
full 450-step runs are ``python lab/01_kernel_sets.py`` (minutes per kernel set); their table is on
the Lab 01 page and tied to its JSON by tests/test_lab01_page.py.
"""

from __future__ import annotations

import json

import pytest

from minigpt.runners import lab01_kernel_sets as kernel_sets
from tests.limits import limit

SHORT = ["--steps", "12", "--warmup", "4", "--test-sentences", "10"]
MARGIN = 5e-6  # half the criterion: the check must pass with room on every kernel set


@pytest.mark.timeout(600)
def test_the_check_passes_with_margin_under_every_kernel_set(tmp_path):
    native = kernel_sets.native_capability()
    ran = []
    for name in kernel_sets.KERNEL_SETS:
        if not kernel_sets.supported(name, native):
            continue
        report_path = tmp_path / name / "report.json"  # a folder that does not exist yet
        proc = kernel_sets.run_check(name, report_path, SHORT, timeout_s=limit(400))
        assert proc.returncode == 0, f"{name}: exit {proc.returncode}\n{proc.stderr[-3000:]}"
        report = json.loads(report_path.read_text())
        assert report["cpu_capability"] == kernel_sets.REPORTED[name], (
            f"{name} was not in force: {report['cpu_capability']}"
        )
        assert report["kernel_set_variables"] == kernel_sets.KERNEL_SETS[name]
        assert report["passed"] and report["ranks_bit_identical"], name
        assert report["max_logit_drift"] <= MARGIN, f"{name}: step drift {report['max_logit_drift']:.2e} > {MARGIN:g}"
        # two ranks add a + b, one process accumulating the same two micro-batches adds the same
        assert report["bit_identical_to_micro_batches"] and report["max_micro_batch_drift"] == 0.0, name
        ran.append(name)
    assert "baseline" in ran, "every CPU runs the baseline kernel set"
    assert ran == [n for n in kernel_sets.KERNEL_SETS if kernel_sets.supported(n, native)]
