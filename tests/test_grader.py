"""The grader proves itself: the reference scores full marks, the untouched stubs score zero,
quickly and each with its own message; the stubs keep the reference's signatures."""

from __future__ import annotations

import inspect
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from minigpt import impl

ROOT = Path(__file__).resolve().parent.parent
SCORE_LINE = re.compile(r"^Lab 00 · MiniGPT and the baseline · (\d+)/(\d+)$", re.M)


def lab00_points() -> int:
    """The points on offer, read from the markers of tests/test_lab00.py."""
    from tests import test_lab00

    total = 0
    for name, fn in vars(test_lab00).items():
        if name.startswith("test_"):
            total += sum(m.args[0] for m in getattr(fn, "pytestmark", []) if m.name == "points")
    return total


def run_graded(impl_name: str, exercises_dir: Path | None = None) -> tuple[subprocess.CompletedProcess, float]:
    env = {k: v for k, v in os.environ.items() if k != impl.DIR_ENV_VAR}
    if exercises_dir is not None:
        env[impl.DIR_ENV_VAR] = str(exercises_dir)
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "pytest", "tests/test_lab00.py", f"--impl={impl_name}", "-q"],
                          cwd=ROOT, capture_output=True, text=True, timeout=180, env=env)
    return proc, time.perf_counter() - start


def test_reference_scores_full_marks():
    proc, _ = run_graded("reference")
    assert proc.returncode == 0, proc.stdout[-3000:]
    earned, total = map(int, SCORE_LINE.search(proc.stdout).groups())
    assert earned == total == lab00_points() > 0


def test_untouched_stubs_score_zero_quickly_with_specific_messages():
    proc, seconds = run_graded("exercises")
    assert proc.returncode == 1, proc.stdout[-3000:]
    earned, total = map(int, SCORE_LINE.search(proc.stdout).groups())
    assert (earned, total) == (0, lab00_points())
    for exercise in ("0.1", "0.2", "0.3", "0.4"):
        assert re.search(rf"lost \d pt: test_\w+: Exercise {re.escape(exercise)}: ", proc.stdout), exercise
    assert seconds < 60, f"grading the stubs took {seconds:.0f} s"


def test_classic_mistakes_lose_exactly_their_points():
    """tests/pitfalls/ holds one classic mistake per exercise (transposed mask, per-token loss,
    rows silently dropped) and one correct answer; each mistake must cost its tests' points."""
    proc, _ = run_graded("exercises", ROOT / "tests" / "pitfalls")
    lost = {name: points for points, name in re.findall(r"lost (\d) pt: (test_\w+):", proc.stdout)}
    assert lost == {
        "test_causal_mask_values": "2",
        "test_causal_mask_hides_the_future_in_the_model": "2",
        "test_masked_loss_value": "2",
        "test_masked_loss_is_the_mean_of_equal_slices": "1",
        "test_rank_slice_rejects_what_cannot_work": "1",
    }, proc.stdout[-3000:]
    earned, total = map(int, SCORE_LINE.search(proc.stdout).groups())
    assert (earned, total) == (lab00_points() - 8, lab00_points())


def test_stubs_have_the_reference_signatures():
    for module, names in impl.REFERENCE.items():
        for name in names:
            ref = impl.reference(module, name)
            stub = getattr(impl.exercise_module(module), name)
            assert inspect.signature(stub) == inspect.signature(ref), f"{module}.{name}"
            with pytest.raises(NotImplementedError, match=r"^Exercise \d+\.\d+: "):
                stub(*[None] * len(inspect.signature(stub).parameters))


def test_impl_switch_rejects_unknown_values(monkeypatch):
    monkeypatch.setenv(impl.ENV_VAR, "mine")
    with pytest.raises(ValueError, match="MINIGPT_IMPL='mine' is not valid"):
        impl.current()
    proc = subprocess.run([sys.executable, "-m", "pytest", "tests/test_lab00.py", "--impl=mine"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 4 and "invalid choice: 'mine'" in proc.stderr
