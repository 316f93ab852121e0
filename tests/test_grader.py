"""The grader proves itself: the reference scores full marks, the untouched stubs score zero,
quickly and each with its own message; the stubs keep the reference's signatures."""

from __future__ import annotations

import importlib
import inspect
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from minigpt import impl
from tests.limits import HINT, limit

ROOT = Path(__file__).resolve().parent.parent
LABS = {"00": "MiniGPT and the baseline", "01": "DDP from scratch", "02": "ZeRO simulator", "03": "FSDP prefetch"}
GRADED_FILES = [f"tests/test_lab{lab}.py" for lab in LABS]


def lab_points(lab: str) -> int:
    """The points on offer in a lab, read from the markers of tests/test_lab<lab>.py
    (a parametrized test earns its points once per case)."""
    module = importlib.import_module(f"tests.test_lab{lab}")
    total = 0
    for name, fn in vars(module).items():
        if name.startswith("test_"):
            marks = getattr(fn, "pytestmark", [])
            cases = max([len(m.args[1]) for m in marks if m.name == "parametrize"] or [1])
            total += cases * sum(m.args[0] for m in marks if m.name == "points")
    return total


def lab00_points() -> int:
    return lab_points("00")


def score(stdout: str, lab: str) -> tuple[int, int]:
    line = re.search(rf"^Lab {lab} · {re.escape(LABS[lab])} · (\d+)/(\d+)$", stdout, re.M)
    assert line, f"no score line for Lab {lab}:\n{stdout[-3000:]}"
    return int(line.group(1)), int(line.group(2))


def lost(stdout: str) -> dict[str, int]:
    return {name: int(points) for points, name in re.findall(r"lost (\d) pt: (test_[\w\[\].-]+):", stdout)}


def run_graded(
    impl_name: str, exercises_dir: Path | None = None, files: list[str] = GRADED_FILES
) -> tuple[subprocess.CompletedProcess, float]:
    env = {k: v for k, v in os.environ.items() if k != impl.DIR_ENV_VAR}
    if exercises_dir is not None:
        env[impl.DIR_ENV_VAR] = str(exercises_dir)
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", *files, f"--impl={impl_name}", "-q"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=limit(300),
        env=env,
    )
    return proc, time.perf_counter() - start


def test_reference_scores_full_marks():
    proc, _ = run_graded("reference")
    assert proc.returncode == 0, proc.stdout[-3000:]
    for lab in LABS:
        earned, total = score(proc.stdout, lab)
        assert earned == total == lab_points(lab) > 0, lab


def test_untouched_stubs_score_zero_quickly_with_specific_messages():
    proc, seconds = run_graded("exercises")
    assert proc.returncode == 1, proc.stdout[-3000:]
    for lab in LABS:
        assert score(proc.stdout, lab) == (0, lab_points(lab)), lab
    for exercise in ("0.1", "0.2", "0.3", "0.4", "1.1", "1.2", "2.1", "2.2", "2.3", "2.4", "3.1", "3.2", "3.3"):
        assert re.search(rf"lost \d pt: test_[\w\[\]]+: Exercise {re.escape(exercise)}: ", proc.stdout), exercise
    assert seconds < limit(90), f"grading the stubs took {seconds:.0f} s, over the {limit(90):g} s limit ({HINT})"


def test_classic_mistakes_lose_exactly_their_points():
    """tests/pitfalls/ holds classic mistakes: for Lab 00 a transposed mask, a per-token loss and
    rows silently dropped (and one correct answer); for Lab 01 a ring that passes whole tensors,
    buckets launched in arrival order, no_sync ignored, and no check for a parameter without
    gradient; for Lab 02 no working buffer and half an offload, a ZeRO-2 that keeps whole
    gradients, HSDP replicas that all-reduce the whole gradient, and a ZeRO-1 step that moves
    parameters no rank gave a gradient; for Lab 03 BACKWARD_POST
    taken for BACKWARD_PRE, the largest local norm taken for the global one, and the tied output
    layer made a unit. Each mistake must cost exactly the tests written to catch it."""
    proc, _ = run_graded("exercises", ROOT / "tests" / "pitfalls")
    assert lost(proc.stdout) == {
        "test_causal_mask_values": 2,
        "test_causal_mask_hides_the_future_in_the_model": 2,
        "test_masked_loss_value": 2,
        "test_masked_loss_is_the_mean_of_equal_slices": 1,
        "test_rank_slice_rejects_what_cannot_work": 1,
        "test_ring_sends_chunks_not_the_whole_tensor": 2,
        "test_ring_leaves_every_rank_with_the_same_bits": 1,
        "test_ddp_launches_buckets_in_the_same_order_on_every_rank": 1,
        "test_ddp_no_sync_accumulates_locally": 1,
        "test_ddp_unused_parameter_is_an_error_that_names_it": 1,
        "test_recipes_and_working_buffer": 2,
        "test_offload": 2,
        "test_zero2_holds_what_the_model_predicts": 2,
        "test_hsdp_traffic_inside_and_across": 2,
        "test_zero1_leaves_gradientless_parameters_alone": 2,
        "test_event_order_fsdp1_backward_prefetch": 2,
        "test_global_norm_from_shards_is_the_norm_of_the_whole[2.0]": 2,
        "test_global_norm_from_shards_is_the_norm_of_the_whole[1.0]": 2,
        "test_the_real_runs_norms": 1,
        "test_units_of_each_policy": 2,
        "test_no_parameter_in_two_units": 2,
    }, proc.stdout[-3000:]
    assert score(proc.stdout, "00") == (lab_points("00") - 8, lab_points("00"))
    assert score(proc.stdout, "01") == (lab_points("01") - 6, lab_points("01"))
    assert score(proc.stdout, "02") == (lab_points("02") - 10, lab_points("02"))
    assert score(proc.stdout, "03") == (lab_points("03") - 11, lab_points("03"))


def test_a_broken_ddp_loses_the_ddp_points():
    """tests/pitfalls/broken_ddp/: the hook's argument taken for the gradient, and buckets that
    keep frozen parameters and tied weights twice. Only the ring's points survive."""
    proc, _ = run_graded("exercises", ROOT / "tests" / "pitfalls" / "broken_ddp", ["tests/test_lab01.py"])
    assert set(lost(proc.stdout)) == {
        "test_buckets_skip_frozen_and_hold_tied_weights_once",
        "test_ddp_gradients_are_the_average_over_ranks",
        "test_ddp_all_reduce_starts_during_backward",
        "test_ddp_launches_buckets_in_the_same_order_on_every_rank",
        "test_ddp_no_sync_accumulates_locally",
        "test_ddp_ring_switch_gives_the_same_gradients",
        "test_ddp_finish_counts_bytes_and_is_harmless_twice",
        "test_ddp_minigpt_two_ranks_equal_one_process",
    }, proc.stdout[-3000:]
    assert "rank 0: BucketedDDP: these parameters received no gradient" in proc.stdout


def test_a_zero1_that_keeps_frozen_parameters_loses_their_points():
    """tests/pitfalls/zero1_keeps_frozen/: the flat buffers keep the frozen parameters. The weights
    stay right (nothing marks them), so only the two tests of what frozen parameters cost fail."""
    proc, _ = run_graded("exercises", ROOT / "tests" / "pitfalls" / "zero1_keeps_frozen", ["tests/test_lab02.py"])
    assert lost(proc.stdout) == {
        "test_trainable_parameters_leave_out_frozen_and_repeat_none": 1,
        "test_zero1_frozen_parameters_cost_nothing_and_never_move": 1,
    }, proc.stdout[-3000:]


def test_stubs_have_the_reference_signatures():
    for module, names in impl.REFERENCE.items():
        for name in names:
            ref = impl.reference(module, name)
            stub = getattr(impl.exercise_module(module), name)
            if inspect.isclass(ref):  # the methods the learner writes, on an unbuilt instance
                assert issubclass(stub, ref), f"{module}.{name} must extend the reference scaffold"
                methods = [m for m, v in vars(stub).items() if inspect.isfunction(v)]
                assert methods, f"{module}.{name} stubs no method"
                for method in methods:
                    assert inspect.signature(getattr(stub, method)) == inspect.signature(getattr(ref, method)), method
                    with pytest.raises(NotImplementedError, match=r"^Exercise \d+\.\d+: "):
                        getattr(object.__new__(stub), method)(
                            *[None] * (len(inspect.signature(getattr(stub, method)).parameters) - 1)
                        )
                continue
            assert inspect.signature(stub) == inspect.signature(ref), f"{module}.{name}"
            with pytest.raises(NotImplementedError, match=r"^Exercise \d+\.\d+: "):
                stub(*[None] * len(inspect.signature(stub).parameters))


def test_impl_switch_rejects_unknown_values(monkeypatch):
    monkeypatch.setenv(impl.ENV_VAR, "mine")
    with pytest.raises(ValueError, match="MINIGPT_IMPL='mine' is not valid"):
        impl.current()
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "tests/test_lab00.py", "--impl=mine"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=limit(120),
    )
    assert proc.returncode == 4 and "mine" in proc.stderr  # pytest's usage error names the value
