"""The grader proves itself (maintainer checks: they run in ``make test``, never in ``make grade``).

* The reference, written into the exercise files, scores full marks through the learner's path;
  the untouched stubs score zero, quickly, each lost point with its exercise's task line and no
  traceback; one exercise is graded in seconds.
* An exercise earns its points alone: with only some exercises written, exactly those score.
* Each classic mistake in ``tests/pitfalls/`` loses exactly the points of the tests written to
  catch it, and a crashed rank's reason is its own error with the likely cause.
* The grader names the real cause: a rank that crashed comes first with its own error and the
  learner's line, the others' "connection closed" after it as consequences; a time-out says which rank
  waited for which; known symptoms (a freed unit used, a micro-batch still held) get a likely cause.
* The report speaks Spanish when asked; the catalog (``minigpt/exercises.toml``) matches the stubs;
  the stubs keep the reference's signatures; every graded test names its exercise.
"""

from __future__ import annotations

import ast
import functools
import importlib
import inspect
import os
import subprocess
import sys
from pathlib import Path

import pytest

from minigpt import grader, impl, predictions
from tests import background, launcher
from tests.grading import grade_in, write_exercises, write_mistakes
from tests.limits import HINT, NOT_GRADED, limit
from tests.ranks import DETAILS_VARIABLE, Launch, explain, scenario

ROOT = Path(__file__).resolve().parent.parent
LABS = {
    "00": "MiniGPT and the baseline",
    "01": "DDP from scratch",
    "02": "ZeRO simulator",
    "03": "FSDP prefetch",
    "04": "FSDP from scratch",
    "05": "Tensor and context parallelism",
    "06": "Pipelines and meshes",
    "07": "All dimensions at once",
}
PITFALLS = ROOT / "tests" / "pitfalls"


def graded_tests(lab: str) -> list[tuple[str, str, int, int]]:
    """(test name, exercise, points, cases) of every graded test of tests/test_lab<lab>.py, read
    from its markers (a parametrized test earns its points once per case)."""
    module = importlib.import_module(f"tests.test_lab{lab}")
    found = []
    for name, fn in vars(module).items():
        marks = getattr(fn, "pytestmark", []) if name.startswith("test_") else []
        points = [m.args[0] for m in marks if m.name == "points"]
        if points:
            exercise = next((m.args[0] for m in marks if m.name == "exercise"), None)
            cases = max([len(m.args[1]) for m in marks if m.name == "parametrize"] or [1])
            found.append((name, exercise, sum(points), cases))
    return found


def lab_points(lab: str) -> int:
    """A lab's points: its own file's graded tests, and its predictions (tests/test_predictions.py, 1 each)."""
    predicted = sum(q.lab == lab for q in predictions.QUESTIONS.values())
    return sum(points * cases for _, _, points, cases in graded_tests(lab)) + predicted


def lab00_points() -> int:
    return lab_points("00")


def grade(monkeypatch, folder: Path | None = None, **kwargs) -> grader.Report:
    """The grader on the learner's path (``--impl exercises``), on ``folder`` (default: the stubs)."""
    if folder is None:
        monkeypatch.delenv(impl.DIR_ENV_VAR, raising=False)
    else:
        monkeypatch.setenv(impl.DIR_ENV_VAR, str(folder))
    return grade_in(os.environ, **kwargs)


def environment(folder: Path | None, **extra: str) -> dict[str, str]:
    """This process's environment with the learner's folder ``folder`` (None: lab/exercises/) and ``extra``,
    on one thread per process (these runs share the cores with the rest of the suite: threads that
    spin-wait for each other on a busy core only burn it)."""
    env = {k: v for k, v in launcher.environ().items() if k != impl.DIR_ENV_VAR}
    env["OMP_NUM_THREADS"] = "1"
    if folder is not None:
        env[impl.DIR_ENV_VAR] = str(folder)
    return {**env, **extra}


def slow_causal_mask(folder: Path) -> Path:
    """The stubs, with a causal mask that never returns."""
    stub = folder / "lab00_baseline.py"
    stub.write_text(stub.read_text() + "\n\ndef causal_mask(size):\n    import time\n\n    time.sleep(3600)\n")
    return folder


WRITTEN_ALONE = {"0.2", "1.3", "2.5", "3.2"}

# the one-mistake folders graded together, each with its lab's files (tests/pitfalls/<folder>/)
WHOLE_LABS = {
    "broken_ddp": "01",
    "zero1_keeps_frozen": "02",
    "unpadded_fsdp": "04",
    "unreduced_tp": "05",
    "unsent_gradient_pipeline": "06",
}


def whole_labs(folder: Path) -> Path:
    """The files of :data:`WHOLE_LABS`' folders in one learner's folder (one lab each)."""
    for name in WHOLE_LABS:
        for file in (PITFALLS / name).glob("*.py"):
            (folder / file.name).write_bytes(file.read_bytes())
    return folder


# The grader's runs that the tests below read, by name: (the learner's folder, or a function of a fresh
# folder that writes it; what to grade; extra environment). Each is a pytest process of its own, often
# with ranks that wait on each other or on a timeout, so they run on the suite's second lane from the
# moment the tests are collected (``submit``, tests/background.py), and the tests that read them run last.
RUNS: dict[str, tuple] = {
    "alone": (lambda tmp: write_exercises(tmp, WRITTEN_ALONE), {}, {}),
    "later": (lambda tmp: write_exercises(tmp, {"1.4"}), {"lab": "01"}, {}),
    "classic": (PITFALLS, {}, {}),
    "unaveraged_ddp": (PITFALLS / "unaveraged_ddp", {"lab": "01"}, {}),
    # five labs' one-mistake folders in one grading (the exercises of their labs and their end-to-end
    # tests, each test with only its own exercise the pitfall's): every scenario of the pipeline's waits
    # out its receive's timeout, 4 s here instead of the graded 10
    "whole labs": (
        whole_labs,
        {"exercise": ",".join([e for e in impl.EXERCISES if impl.lab_of(e) in WHOLE_LABS.values()] + ["all"])},
        {"MINIGPT_PIPELINE_STEP_TIMEOUT_S": "4"},
    ),
    # limits scaled down to a twentieth: 1.5 s instead of 30 s
    "time_limit": (
        lambda tmp: slow_causal_mask(write_exercises(tmp, set())),
        {"exercise": "0.1"},
        {"MINIGPT_TIME_SCALE": "0.05"},
    ),
    # rank 1 starts 8 s late, beyond a start-up timeout of 3 s
    "could_not_connect": (
        lambda tmp: write_exercises(tmp, {"1.3"}),
        {"exercise": "1.3"},
        {"MINIGPT_LATE_RANK": "1:8", "MINIGPT_START_UP_TIMEOUT": "3"},
    ),
    "spanish": (None, {"exercise": "0.1", "lang": "es"}, {}),
}


def graded_run(spec: tuple, tmp: Path) -> grader.Report:
    folder, what, extra = spec
    if callable(folder):
        folder = folder(tmp)
    env = environment(folder, **extra)
    return grade_in(env, **what)


def submit(config: pytest.Config) -> dict:
    """Every run of ``RUNS``, ``SEPARATE_CAUSES`` and ``packed_runs()``, on the suite's second lane
    (tests/background.py), in the order the tests read them."""
    last = ("time_limit", "could_not_connect", "spanish")
    runs = {name: spec for name, spec in RUNS.items() if name not in last}
    for folder in SEPARATE_CAUSES:
        runs[f"cause {folder}"] = ((PITFALLS / folder).resolve(), {"exercise": NAMED_CAUSES[folder][0]}, {})
    for run, files in packed_runs().items():
        runs[run] = (functools.partial(write_mistakes, files), {"exercise": ",".join(files)}, {})
    runs.update({name: RUNS[name] for name in last})
    lane = background.lane(config)
    return {name: lane.submit(f"grader {name}", functools.partial(graded_run, spec)) for name, spec in runs.items()}


@pytest.fixture(scope="module")
def graded(request):
    """The futures of the grader's runs (``submit``); each test waits for its own."""
    return submit(request.config)


def report_of(graded, name: str) -> grader.Report:
    """The report of run ``name``; of a folder of :data:`WHOLE_LABS`, its lab's part of their grading."""
    if name not in WHOLE_LABS:
        return graded[name].result(timeout=limit(280))
    whole = graded["whole labs"].result(timeout=limit(280))
    report = grader.Report([r for r in whole.results if r.lab == WHOLE_LABS[name]], whole.seconds, whole.lang)
    report.text = grader.render(report)
    return report


def lost(report: grader.Report) -> dict[str, int]:
    """The points lost: a test not graded (its ranks could not connect, or an earlier crash) loses none."""
    return {r.name: r.points for r in report.results if not r.passed and r.kind != NOT_GRADED}


def by_exercise(report: grader.Report) -> dict[str, tuple[int, int]]:
    """exercise -> (earned, total)."""
    out: dict[str, tuple[int, int]] = {}
    for r in report.results:
        earned, total = out.get(r.exercise, (0, 0))
        out[r.exercise] = (earned + (r.points if r.passed else 0), total + r.points)
    return out


# ----------------------------------------------------------------------------------------------
# full marks, zero, one exercise at a time


def test_the_reference_written_into_the_exercises_scores_full_marks(reference_graded):
    report = reference_graded.report
    assert report.earned == report.total, report.text
    for lab in LABS:
        assert sum(r.points for r in report.results if r.lab == lab) == lab_points(lab) > 0, lab
        assert f"Lab {lab} · {LABS[lab]} · {lab_points(lab)}/{lab_points(lab)}" in report.text, report.text
    exercise_lines = [line for line in report.text.splitlines() if line.startswith("  ") and not line.startswith("   ")]
    assert len(exercise_lines) == len(impl.EXERCISES) + len(LABS), report.text  # each exercise, and "all" per lab
    assert all(line.endswith("full marks") for line in exercise_lines), report.text


def test_untouched_stubs_score_zero_quickly_each_with_its_task(stubs_graded):
    report = stubs_graded.report
    assert report.earned == 0 and report.total == sum(lab_points(lab) for lab in LABS), report.text
    for r in report.results:
        assert r.kind == "not written", f"{r.name}: {r.kind}: {r.reason}"
        if r.exercise != "all":  # a test of exercise X blames exercise X, whatever it calls
            kind = "Prediction" if r.exercise.startswith("P") else "Exercise"
            assert r.reason.startswith(f"{kind} {r.exercise}: "), f"{r.name} ({r.exercise}): {r.reason}"
    lines = report.text.splitlines()
    assert not any("Traceback" in line or line.lstrip().startswith('File "') for line in lines), report.text
    # focused: a lab with nothing written yet is one line, which says where to start
    assert len(lines) <= 60, f"{len(lines)} lines for the untouched stubs, expected at most 60:\n{report.text}"
    for lab, title in LABS.items():
        first = min((e for e in impl.EXERCISES if e.split(".")[0] == str(int(lab))), key=lambda e: int(e.split(".")[1]))
        line = (
            f"Lab {lab} · {title} · 0/{lab_points(lab)} · nothing written yet (start: make hint EX={first} · "
            f"make grade EX={first})"
        )
        assert line in lines, report.text
    assert report.seconds < limit(90), f"grading the stubs took {report.seconds:.0f} s, over {limit(90):g} s ({HINT})"


def test_one_lab_of_stubs_shows_every_exercise_and_what_all_together_waits_for(monkeypatch):
    """A lab asked for (or being worked on) shows every exercise, its task lines, one line per lost
    test; its "All together" row says which exercises it waits for, not another stub's message."""
    report = grade(monkeypatch, lab="00")
    lines = report.text.splitlines()
    assert sum(line.lstrip().startswith("−") for line in lines) == len(report.results), report.text
    for exercise in ("0.1", "0.2", "0.3", "0.4"):
        assert any(line.startswith(f"  Exercise {exercise} · ") for line in lines), report.text
    waits = [line for line in lines if "test_all_together" in line]
    assert waits and all(line.endswith("waits for Exercises 0.1, 0.2, 0.3, 0.4 (not written yet)") for line in waits), (
        report.text
    )
    assert "A hint: make hint EX=0.1" in report.text, report.text


def test_one_exercise_grades_only_that_exercise(graded):
    """``make grade EX=4.1`` (the run of tests/pitfalls/chunked_fsdp/): that exercise's graded tests
    and nothing else; how long one exercise takes is the benchmark ``make check-grades``, on each lab page."""
    report = report_of(graded, "cause chunked_fsdp")
    assert {r.exercise for r in report.results} == {"4.1"} and report.total > 0, report.text


def test_an_exercise_earns_its_points_alone(graded):
    """Exercise 1.3 written before 1.2 and 1.4, 2.5 before 2.4, 3.2 alone, 0.2 alone: each scores
    in full, nothing else scores (the end-to-end tests need everything)."""
    report = report_of(graded, "alone")
    for exercise, (earned, total) in by_exercise(report).items():
        assert earned == (total if exercise in WRITTEN_ALONE else 0), (
            f"Exercise {exercise}: {earned}/{total}\n{report.text}"
        )
    # the labs being worked on show every exercise, the others one line each; All together waits
    assert "waits for Exercises 0.1, 0.3, 0.4 (not written yet)" in report.text, report.text
    assert "waits for Exercises 1.1, 1.2, 1.4 (not written yet)" in report.text, report.text
    for lab in ("04", "05", "06", "07"):
        assert f"Lab {lab} · {LABS[lab]} · 0/{lab_points(lab)} · nothing written yet" in report.text, report.text


def test_a_later_exercise_earns_its_points_before_the_earlier_ones(graded):
    report = report_of(graded, "later")
    scores = by_exercise(report)
    assert scores["1.4"][0] == scores["1.4"][1] > 0, report.text
    assert all(earned == 0 for exercise, (earned, _) in scores.items() if exercise != "1.4"), report.text


# ----------------------------------------------------------------------------------------------
# classic mistakes


def test_classic_mistakes_lose_exactly_their_points(graded):
    """tests/pitfalls/ holds classic mistakes: for Lab 00 a transposed mask, a per-token loss and
    rows silently dropped (and one correct answer); for Lab 01 a ring that passes whole tensors,
    buckets that ignore the dtype, buckets launched in arrival order, no_sync ignored, no check for a
    parameter without gradient, and the averages copied back instead of each .grad its slot; for Lab 02 no working buffer and half an offload, a ZeRO-2 that keeps whole
    gradients, HSDP replicas that all-reduce the whole gradient, and a ZeRO-1 step that moves
    parameters no rank gave a gradient; for Lab 03 BACKWARD_POST taken for BACKWARD_PRE, the
    largest local norm taken for the global one, and the tied output layer made a unit; for Lab 04 a
    tied weight owned twice, a unit not gathered again for backward (its backward crashes on 0-byte
    storage: a lost test, not a hang), the reduce-scatter's sum not divided by the world size, the
    local norm taken for the global one, and the prefetch of the unit whose backward just ran. Each
    mistake costs exactly the tests written to catch it, and the lab's end-to-end test when it
    changes what training computes (Lab 01's mistakes leave a 2-rank MiniGPT run right; Lab
    04's wrong prefetch computes the same weights but gathers a freed unit again, and the
    end-to-end test counts the bytes of a step); for Lab 05 the row-parallel bias added on every rank
    before the sum, f's all-reduce moved into forward (f written as g), an online softmax that does
    not rescale the old sums when the maximum moves, and a block mask on local positions (every
    block pair gets the diagonal triangle); for Lab 06 1F1B's warm-up counted from the wrong end (a
    deadlock check_schedule names before anything is sent) and received activations used without
    requires_grad_() (no input gradient to send back: the stage's own error, not its neighbour's
    timeout, is the reason), HSDP's two degrees swapped (the replica groups built across the wrong
    ranks), and the gradients all-reduced over the whole world instead of the replica group; for Lab 07
    the mesh laid out with tp outermost (every dimension's groups on the wrong ranks), the data-parallel
    index counted over every rank (a TP group's ranks given different rows), and FSDP's padding rows
    kept in the whole parameter (and, all three at once, the end-to-end test: TP groups across the nodes)."""
    report = report_of(graded, "classic")
    assert lost(report) == {
        "test_causal_mask_values": 2,
        "test_causal_mask_hides_the_future_in_the_model": 2,
        "test_masked_loss_value": 2,
        "test_masked_loss_is_the_mean_of_equal_slices": 1,
        "test_rank_slice_rejects_what_cannot_work": 1,
        "test_all_together_two_simulated_ranks_train_like_the_reference": 2,
        "test_ring_sends_chunks_not_the_whole_tensor": 2,
        "test_ring_leaves_every_rank_with_the_same_bits": 1,
        "test_buckets_close_when_they_reach_the_cap": 1,
        "test_ddp_launches_buckets_in_the_same_order_on_every_rank": 1,
        "test_ddp_no_sync_accumulates_locally": 1,
        "test_ddp_finish_counts_bytes_and_is_harmless_twice": 1,
        "test_ddp_unused_parameter_is_an_error_that_names_it": 1,
        "test_recipes_and_working_buffer": 2,
        "test_offload": 2,
        "test_zero2_holds_what_the_model_predicts": 2,
        "test_hsdp_traffic_inside_and_across": 2,
        "test_zero1_leaves_gradientless_parameters_alone": 2,
        "test_all_together_your_zero2_obeys_your_formulas_and_your_zero1_trains": 2,
        "test_event_order_fsdp1_backward_prefetch": 2,
        "test_global_norm_from_shards_is_the_norm_of_the_whole[2.0]": 2,
        "test_global_norm_from_shards_is_the_norm_of_the_whole[1.0]": 2,
        "test_the_real_runs_norms": 1,
        "test_units_of_each_policy": 2,
        "test_no_parameter_in_two_units": 2,
        "test_all_together_your_units_your_order_and_your_norm": 2,
        "test_unit_parameters_tied_weight_once_nested_blocks_skipped": 2,
        "test_unit_parameters_frozen_owned_and_every_slot_named": 1,
        "test_hooks_gradients_equal_the_reference_fsdp": 2,
        "test_hooks_free_blocks_after_forward_and_gather_them_for_backward": 2,
        "test_hooks_follow_fsdp2_order": 1,
        "test_hooks_hold_no_more_in_backward_than_the_reference_fsdp": 2,
        "test_reduce_gradients_is_the_mean_over_ranks_with_padding": 2,
        "test_global_grad_norm_is_the_norm_of_the_whole_gradient": 2,
        "test_global_grad_norm_is_fsdp2s_to_the_bit": 1,
        "test_backward_prefetch_targets": 2,
        "test_prefetch_on_two_ranks_follows_fsdp2_order": 1,
        "test_all_together_your_fsdp_trains_minigpt_like_one_process": 2,
        "test_row_parallel_linear_sums_the_partial_products_and_adds_the_bias_once": 3,
        "test_f_is_the_identity_forward_and_sums_the_gradients_backward": 2,
        "test_f_and_g_around_a_column_then_row_mlp_equal_one_process": 1,
        "test_online_softmax_merges_blocks_into_one_softmax": 2,
        "test_block_mask_compares_global_positions": 2,
        "test_all_together_your_tensor_parallel_minigpt_equals_one_process": 2,
        "test_all_together_your_ring_attention_equals_full_causal_attention": 2,
        "test_one_f_one_b_runs_every_micro_batch_once_and_never_deadlocks": 3,
        "test_one_f_one_b_holds_at_most_p_minus_s_and_is_the_simulators_1f1b": 2,
        "test_your_steps_give_one_processs_gradients_with_gpipe_and_1f1b": 3,
        "test_your_steps_send_the_modelled_bytes_and_hold_what_the_schedule_says": 2,
        "test_all_together_your_1f1b_pipeline_equals_one_process": 2,
        "test_resolve_hsdp_shards_inside_a_node_and_infers_the_missing_degree": 2,
        "test_hsdp_bytes_per_dim_adds_each_units_collectives": 2,
        "test_hsdp_bytes_per_dim_equals_what_fsdp2_sent": 2,
        "test_mesh_groups_of_the_labs_two_layouts": 2,
        "test_mesh_groups_follow_the_mesh_order_whatever_the_dicts_order": 2,
        "test_mesh_groups_flatten_several_dimensions_in_the_mesh_order": 1,
        "test_batch_plan_gives_data_parallel_ranks_their_own_rows_and_tp_cp_ranks_the_same": 2,
        "test_whole_parameter_undoes_the_tp_cut_and_the_fsdp_padding": 2,
        "test_whole_parameter_of_a_tp_whole_tensor_is_a_new_tensor": 1,
        "test_whole_parameter_rebuilds_minigpt_from_a_tp2_by_shard3_cut": 1,
        "test_all_together_your_mesh_feeds_every_rank_and_rebuilds_minigpt": 2,
    }, report.text
    # buckets launched in arrival order crash rank 0 inside gloo: the reason is gloo's own words,
    # with the likely cause, not "it crashed"
    order = next(r for r in report.results if r.name == "test_ddp_launches_buckets_in_the_same_order_on_every_rank")
    assert "Is there a distributed collective mismatch" in order.reason, order.reason
    assert "likely cause: the ranks ran different collectives" in order.reason, order.reason
    assert "enforce fail" not in order.reason and ".cc:" not in order.reason, order.reason
    unwatched = next(
        r for r in report.results if r.name == "test_your_steps_give_one_processs_gradients_with_gpipe_and_1f1b"
    )
    assert "did forward_step call requires_grad_() on the received activations?" in unwatched.reason, unwatched.reason
    # issue 46: a gradient exactly world_size times the mean is named as summed, not averaged
    summed = next(r for r in report.results if r.name == "test_reduce_gradients_is_the_mean_over_ranks_with_padding")
    assert "every gradient is exactly twice the mean: summed, not averaged" in summed.reason, summed.reason
    # issue 46: the mesh laid out column-major (tp outermost) is named by a rank's coordinates and the
    # dimension that varies fastest
    layout = next(r for r in report.results if r.name == "test_mesh_groups_of_the_labs_two_layouts")
    for words in (
        "rank 4 = (dp_replicate 1, dp_shard 0, cp 0, tp 0)",
        "expected tp to vary fastest",
        "yours varies dp_replicate fastest",
    ):
        assert words in layout.reason, layout.reason


def test_a_broken_ddp_loses_the_ddp_points(graded):
    """tests/pitfalls/broken_ddp/: the hook's argument taken for the gradient (1.3), and buckets
    that keep frozen parameters and tied weights twice (1.2). Graded one exercise at a time, the
    ring (1.1) and the end of backward (1.4) keep their points, and so does the overlap test of
    1.3 (the broken hook still launches each bucket in time); the end-to-end run fails on the
    frozen and tied parameters."""
    report = report_of(graded, "broken_ddp")
    assert set(lost(report)) == {
        "test_buckets_skip_frozen_and_hold_tied_weights_once",
        "test_ddp_gradients_are_the_average_over_ranks",
        "test_ddp_launches_buckets_in_the_same_order_on_every_rank",
        "test_ddp_no_sync_accumulates_locally",
        "test_ddp_ring_switch_gives_the_same_gradients",
        "test_ddp_minigpt_two_ranks_equal_one_process",
    }, report.text
    assert "rank 0: BucketedDDP: these parameters received no gradient" in report.text


def test_a_ddp_that_sums_instead_of_averaging_loses_the_end_to_end_points(graded):
    """tests/pitfalls/unaveraged_ddp/: no division by the world size. The ranks agree, AdamW hides
    most of it, but every test that compares gradients catches it, the end-to-end one included."""
    report = report_of(graded, "unaveraged_ddp")
    assert lost(report) == {
        "test_ddp_gradients_are_the_average_over_ranks": 2,
        "test_ddp_launches_buckets_in_the_same_order_on_every_rank": 1,
        "test_ddp_no_sync_accumulates_locally": 1,
        "test_ddp_ring_switch_gives_the_same_gradients": 1,
        "test_ddp_minigpt_two_ranks_equal_one_process": 2,
    }, report.text


def test_a_zero1_that_keeps_frozen_parameters_loses_their_points(graded):
    """tests/pitfalls/zero1_keeps_frozen/: the flat buffers keep the frozen parameters. The weights
    stay right (nothing marks them), so only the two tests of what frozen parameters cost fail."""
    report = report_of(graded, "zero1_keeps_frozen")
    assert lost(report) == {
        "test_trainable_parameters_leave_out_frozen_and_repeat_none": 1,
        "test_zero1_frozen_parameters_cost_nothing_and_never_move": 1,
    }, report.text


def test_an_unpadded_reduce_scatter_loses_its_points(graded):
    """tests/pitfalls/unpadded_fsdp/: the gradients reduce-scattered from a buffer that is not
    padded parameter by parameter, so chunk r is not rank r's rows (MiniGPT's 609-row embedding on
    2 ranks). The reduce-scatter test and the end-to-end run catch it; nothing else changes."""
    report = report_of(graded, "unpadded_fsdp")
    assert lost(report) == {
        "test_reduce_gradients_is_the_mean_over_ranks_with_padding": 2,
        "test_all_together_your_fsdp_trains_minigpt_like_one_process": 2,
    }, report.text


def test_an_f_without_its_backward_all_reduce_loses_its_points(graded):
    """tests/pitfalls/unreduced_tp/: f the identity both ways, so each rank keeps only its own share
    of the input's gradient. The forward is right; the test of f, the MLP's input gradient and the
    end-to-end model's gradients catch it, and ring attention (no f in it) keeps its points."""
    report = report_of(graded, "unreduced_tp")
    assert lost(report) == {
        "test_f_is_the_identity_forward_and_sums_the_gradients_backward": 2,
        "test_f_and_g_around_a_column_then_row_mlp_equal_one_process": 1,
        "test_all_together_your_tensor_parallel_minigpt_equals_one_process": 2,
    }, report.text


def test_a_backward_step_that_keeps_the_input_gradient_loses_its_points(graded):
    """tests/pitfalls/unsent_gradient_pipeline/: backward_step never sends the input's gradient back.
    The stage before waits for it until its receive's timeout (not a hang: 4 s here instead of the
    graded run's 10, since each of the five scenarios waits it out); the steps' tests and the end-to-end
    run lose their points with that timeout's words, and the 1F1B lists keep theirs."""
    report = report_of(graded, "unsent_gradient_pipeline")
    assert lost(report) == {
        "test_your_steps_give_one_processs_gradients_with_gpipe_and_1f1b": 3,
        "test_your_steps_send_the_modelled_bytes_and_hold_what_the_schedule_says": 2,
        "test_all_together_your_1f1b_pipeline_equals_one_process": 2,
    }, report.text
    steps = next(
        r for r in report.results if r.name == "test_your_steps_give_one_processs_gradients_with_gpipe_and_1f1b"
    )
    assert "does backward_step send the input's gradient back?" in steps.reason, steps.reason
    assert "s for the gradient of micro-batch 0 from stage" in steps.reason, steps.reason


# the rows of issue 30's table: each mistake loses exactly its points, with a reason that names its cause
NAMED_CAUSES = {
    "chunked_fsdp": (
        "4.1",
        {"test_shard_rows_pads_and_cuts_equal_shards": 2},
        ("IndexError", "(in lab04_fsdp.py, line ", ", shard_rows)"),
    ),
    "slot_twice_fsdp": (
        "4.2",
        {"test_unit_parameters_frozen_owned_and_every_slot_named": 1},
        ("a module held under two names", "expected one slot per (module, attribute)"),
    ),
    ".": (  # tests/pitfalls/ itself: before_backward that does not make the unit whole again
        "4.3",
        {
            "test_hooks_gradients_equal_the_reference_fsdp": 2,
            "test_hooks_free_blocks_after_forward_and_gather_them_for_backward": 2,
            "test_hooks_follow_fsdp2_order": 1,
            "test_hooks_hold_no_more_in_backward_than_the_reference_fsdp": 2,
        },
        ("before_backward of blocks.3 returned with the unit's parameters freed", "its backward reads them next"),
    ),
    # issue 46's table: after_backward that reduce-scatters and never frees the unit
    "never_freed_in_backward": (
        "4.3",
        {"test_hooks_hold_no_more_in_backward_than_the_reference_fsdp": 2},
        ("blocks.3 still held its gathered parameters when blocks.2's backward started", "free a unit after its last"),
    ),
    "one_number_norm_fsdp": (
        "4.4",
        {"test_global_grad_norm_is_the_norm_of_the_whole_gradient": 2, "test_global_grad_norm_is_fsdp2s_to_the_bit": 1},
        ("one number per rank sums in another order", "no longer FSDP2's norm to the bit"),
    ),
    # issue 46's table: the norm as the square root of the summed squares, not the norm of the norms
    "summed_squares_norm_fsdp": (
        "4.4",
        {"test_global_grad_norm_is_fsdp2s_to_the_bit": 1},
        ("the same norm on paper, another rounding", "combine per parameter first, as FSDP2 does"),
    ),
    "last_rank_index_error": (  # one rank crashes in reduce@4.4: charged there, once
        "4.4",
        {"test_reduce_gradients_is_the_mean_over_ranks_with_padding": 2},
        ("rank 1, reduce@4.4: IndexError", "(in lab04_fsdp.py, line "),
    ),
    "data_group_in_hsdp": (  # the bytes right, the groups not: no other test looks at their names
        "2.3",
        {"test_hsdp_traffic_inside_and_across": 2},
        ("your collectives' groups are ['data', 'replica'], expected ['replica', 'shard']",),
    ),
    "forgot_the_ring_factor": (  # the buffer's size, as if the ring sent each byte once
        "P1.1",
        {"test_your_prediction_is_what_the_code_measures[P1.1]": 1},
        ("you predicted 2,030,208; this run measured 3,045,312",),
    ),
    "held_pipeline": (
        "6.2",
        {"test_your_steps_send_the_modelled_bytes_and_hold_what_the_schedule_says": 2},
        ("B ran for micro-batches [0, 1, 2, 3], but each was still in held afterwards", "held.pop(i)"),
    ),
    # issue 46's table: f's backward on the default group, seen on 4 ranks as two tp groups of 2
    "default_group_tp": (
        "5.2",
        {
            "test_f_is_the_identity_forward_and_sums_the_gradients_backward": 2,
            "test_f_and_g_around_a_column_then_row_mlp_equal_one_process": 1,
        },
        ("was summed over all 4 ranks, not over its tp group {0, 1}", "ran on the default group"),
    ),
    # issue 46's table: the CP coordinate taken as rank % cp, with the chunks of every rank shown
    "rank_mod_cp_chunks": (
        "7.2",
        {"test_batch_plan_token_chunks_balance_the_causal_work": 2},
        (
            "rank 1 = (dp_replicate 0, dp_shard 0, cp 0, tp 1): chunks (1, 2), expected (0, 3)",
            "Chunks by rank, yours: 0:(0, 3) 1:(1, 2)",
            "yours picks the pair of rank % cp, not of the rank's cp coordinate",
        ),
    ),
}


@pytest.mark.parametrize("folder", list(NAMED_CAUSES))
def test_a_mistake_loses_its_points_with_a_reason_that_names_its_cause(graded, folder):
    """Issue 30's table, one exercise graded at a time: shards cut with torch.chunk lose the shard
    test with the IndexError and the learner's line, and the correct gather_rows keeps its point; a
    module met twice counted twice; a unit not made whole again in before_backward, named by its move
    instead of "storage of size 0"; the norm summed as one number per rank; held[i] read instead of
    popped, named as still held (backward did run). Issue 46's: a unit never freed after its backward,
    named by the unit still held when the next one's backward started; the norm as the square root of
    all the squares, not FSDP2's bits; f's backward all-reduced on the
    default group, named as a sum over all 4 ranks instead of its tp group; the CP coordinate taken as
    rank % cp, with the rank's coordinates and every rank's chunks against the balanced pairs."""
    exercise, expected, words = NAMED_CAUSES[folder]
    if folder in SEPARATE_CAUSES:
        report = report_of(graded, f"cause {folder}")
        results = report.results
    else:
        report, results = graded_alone(graded, f"{folder}/{impl.EXERCISES[exercise][0]}")
    assert {r.name: r.points for r in results if not r.passed and r.kind != NOT_GRADED} == expected, report.text
    for r in results:
        if not r.passed and r.kind != NOT_GRADED:  # what a crash leaves ungraded: the test below
            assert r.kind == "failed" and all(w in r.reason for w in words), f"{r.name}: {r.reason}"


def test_a_crash_in_one_test_leaves_the_next_not_graded_not_failed(graded):
    """tests/pitfalls/last_rank_index_error/: reduce_gradients raises on the last rank only, and the other rank
    waits in its reduce-scatter. The test of reduce_gradients loses its points with rank 1's own error and line;
    global_grad_norm, correct (the reference's) but run next on the same two ranks, is not graded, not failed,
    and says why: the earlier crash, named first."""
    report = report_of(graded, "cause last_rank_index_error")
    norm = next(r for r in report.results if r.name == "test_global_grad_norm_is_the_norm_of_the_whole_gradient")
    if norm.passed:  # the surviving rank's group recovered in time: graded, and right; never charged
        assert report.text.count("IndexError") == 1, report.text
        return
    assert norm.kind == NOT_GRADED, (norm, report.text)
    assert "it ran after 'reduce@4.4', where rank 1, reduce@4.4: IndexError" in norm.reason, norm.reason
    assert "(in lab04_fsdp.py, line " in norm.reason and "fix that one first" in norm.reason, norm.reason
    assert report.text.count("IndexError") == 2, report.text  # its line, and the reason of what it left ungraded


# tests/pitfalls/rules/: one stated rule of a stub broken per file, the file named by its mistake (its docstring
# says it): its exercise, and the tests it loses with their points
RULES = {
    "loss_as_a_python_float": (
        "0.2",
        {"test_masked_loss_value": 2, "test_masked_loss_ignores_unmasked_positions_and_has_gradients": 1},
    ),
    "world_of_zero_divides_by_zero": ("0.3", {"test_rank_slice_rejects_what_cannot_work": 1}),
    "warmup_counted_from_step_one": ("0.4", {"test_lr_schedule": 2}),
    "avg_never_divided": ("1.1", {"test_ring_average_and_a_world_of_one": 1}),
    "second_finish_not_harmless": ("1.4", {"test_ddp_finish_counts_bytes_and_is_harmless_twice": 1}),
    "bucket_closed_before_the_cap": (
        "1.2",
        {
            "test_buckets_reverse_order_up_to_the_cap": 2,
            "test_buckets_close_when_they_reach_the_cap": 1,
            "test_buckets_skip_frozen_and_hold_tied_weights_once": 2,
        },
    ),
    "stage_two_gradients_left_whole": (
        "2.1",
        {
            "test_every_cell_of_the_zero_papers_table_1[7500000000.0]": 2,
            "test_every_cell_of_the_zero_papers_table_1[128000000000.0]": 2,
            "test_every_cell_of_the_zero_papers_table_1[1000000000000.0]": 2,
            "test_recipes_and_working_buffer": 2,
        },
    ),
    "zero3_gathers_once": ("2.3", {"test_communication_per_stage": 2, "test_hsdp_traffic_inside_and_across": 2}),
    "repeated_parameter_kept_twice": ("2.4", {"test_trainable_parameters_leave_out_frozen_and_repeat_none": 1}),
    "fsdp1_with_fsdp2s_post_backward": ("3.1", {"test_event_order_fsdp1_forward_prefetch": 1}),
    "dtensor_term_not_its_local_shard": ("3.2", {"test_the_real_runs_norms": 1}),
    "closure_under_no_grad": ("2.5", {"test_zero1_equals_plain_optimizers": 2}),
    "padding_rows_gathered_back": ("4.1", {"test_gather_rows_gives_back_the_whole_tensor": 1}),
    "nested_units_not_skipped": ("4.2", {"test_unit_parameters_tied_weight_once_nested_blocks_skipped": 2}),
    "never_freed_after_forward": (
        "4.3",
        {
            "test_hooks_gradients_equal_the_reference_fsdp": 2,
            "test_hooks_free_blocks_after_forward_and_gather_them_for_backward": 2,
            "test_hooks_follow_fsdp2_order": 1,
            "test_hooks_hold_no_more_in_backward_than_the_reference_fsdp": 2,
        },
    ),
    "full_gradients_kept": ("4.4", {"test_reduce_gradients_is_the_mean_over_ranks_with_padding": 2}),
    "row_parallel_reduced_twice": (
        "5.1",
        {"test_row_parallel_linear_sums_the_partial_products_and_adds_the_bias_once": 3},
    ),
    "padding_columns_counted_as_words": (
        "5.3",
        {
            "test_vocab_parallel_loss_equals_one_process_on_every_rank": 2,
            "test_vocab_parallel_loss_gradient_is_softmax_minus_onehot_on_this_ranks_columns": 2,
        },
    ),
    "flattened_in_the_callers_order": ("7.1", {"test_mesh_groups_flatten_several_dimensions_in_the_mesh_order": 1}),
    "two_neighbouring_chunks": ("7.2", {"test_batch_plan_token_chunks_balance_the_causal_work": 2}),
    "fused_qkv_joined_as_one_block": (
        "7.3",
        {
            "test_whole_parameter_puts_the_fused_qkv_weight_back": 2,
            "test_whole_parameter_rebuilds_minigpt_from_a_tp2_by_shard3_cut": 1,
        },
    ),
    "first_hook_resets_nothing": ("1.3", {"test_ddp_gradients_are_the_average_over_ranks": 2}),
    "empty_sentence_divides_zero_by_zero": (
        "0.2",
        {
            "test_masked_loss_value": 2,
            "test_masked_loss_ignores_unmasked_positions_and_has_gradients": 1,
            "test_masked_loss_is_the_mean_of_equal_slices": 1,
        },
    ),
    "rank_outside_the_world_accepted": ("0.3", {"test_rank_slice_rejects_what_cannot_work": 1}),
    "cosine_ends_at_zero": ("0.4", {"test_lr_schedule": 2}),
    "weights_offloaded_below_stage_three": ("2.1", {"test_memory_rejects_bad_input": 1}),
    "all_reduced_per_unit": ("2.2", {"test_zero2_sends_what_the_model_predicts": 1}),
    "stage_zero_given_replicas": ("2.3", {"test_hsdp_traffic_inside_and_across": 2}),
    "settings_never_copied_to_inner_groups": (
        "2.5",
        {"test_zero1_equals_plain_optimizers": 2, "test_zero1_leaves_gradientless_parameters_alone": 2},
    ),
    "unknown_variant_raises_key_error": ("3.1", {"test_event_order_rejects_bad_input": 1}),
    "nonpositive_norm_type_accepted": ("3.2", {"test_global_norm_rejects_bad_input": 1}),
    "unknown_policy_taken_as_whole": ("3.3", {"test_units_reject_an_unknown_policy": 1}),
    "all_gather_into_a_list": ("4.1", {"test_gather_rows_gives_back_the_whole_tensor": 1}),
    "forward_prefetch_waited_for": ("4.3", {"test_hooks_follow_fsdp2_order": 1}),
    "missing_gradient_not_zeros": ("4.4", {"test_reduce_gradients_is_the_mean_over_ranks_with_padding": 2}),
    "depth_zero_prefetches_one_unit": ("4.5", {"test_backward_prefetch_targets": 2}),
    "uneven_row_cut_accepted": ("5.1", {"test_row_slice_keeps_each_ranks_input_features_and_the_bias_whole": 1}),
    "other_ranks_target_logit_added": ("5.3", {"test_vocab_parallel_loss_equals_one_process_on_every_rank": 2}),
    "g_sums_backward_too": (
        "5.2",
        {
            "test_g_sums_forward_and_is_the_identity_backward": 2,
            "test_f_and_g_around_a_column_then_row_mlp_equal_one_process": 1,
        },
    ),
    "gpipe_order_for_1f1b": ("6.1", {"test_one_f_one_b_holds_at_most_p_minus_s_and_is_the_simulators_1f1b": 2}),
    "fractional_degree_accepted": ("6.3", {"test_resolve_hsdp_refuses_what_cannot_work_naming_the_numbers": 2}),
    "gradients_at_the_weights_size": ("6.4", {"test_hsdp_bytes_per_dim_adds_each_units_collectives": 2}),
    "pp_quietly_dropped": ("7.1", {"test_mesh_groups_refuse_an_unknown_dimension": 1}),
    "uneven_rows_rounded_down": ("7.2", {"test_batch_plan_refuses_what_does_not_split": 1}),
    "single_shard_returns_a_view": ("7.3", {"test_whole_parameter_of_a_tp_whole_tensor_is_a_new_tensor": 1}),
    "float_mask_not_bool": ("0.1", {"test_causal_mask_values": 2, "test_causal_mask_hides_the_future_in_the_model": 2}),
    "message_names_the_batch": ("0.3", {"test_rank_slice_rejects_what_cannot_work": 1}),
    "cosine_returns_a_tensor": ("0.4", {"test_lr_schedule": 2}),
    "max_summed_not_refused": ("1.1", {"test_ring_rejects_an_unknown_op": 1}),
    "launched_after_backward": ("1.3", {"test_ddp_all_reduce_starts_during_backward": 1}),
    "buckets_in_registration_order": (
        "1.2",
        {
            "test_buckets_reverse_order_up_to_the_cap": 2,
            "test_buckets_close_when_they_reach_the_cap": 1,
            "test_buckets_skip_frozen_and_hold_tied_weights_once": 2,
        },
    ),
    "fractional_devices_accepted": ("2.1", {"test_memory_rejects_bad_input": 1}),
    "shard_divided_twice": (
        "2.2",
        {
            "test_zero2_ends_with_ddps_weights_bit_for_bit[fp32]": 3,
            "test_zero2_ends_with_ddps_weights_bit_for_bit[mixed]": 3,
        },
    ),
    "fractional_shard_degree_rounded": ("2.3", {"test_hsdp_traffic_inside_and_across": 2}),
    "weights_all_reduced_from_zeros": ("2.5", {"test_zero1_sends_the_ring_bytes": 1}),
    "inf_norm_terms_summed": ("3.2", {"test_global_norm_from_shards_is_the_norm_of_the_whole[inf]": 2}),
    "grad_overwritten_not_accumulated": ("4.4", {"test_reduce_gradients_is_the_mean_over_ranks_with_padding": 2}),
    "no_gather_ahead_in_before_backward": ("4.3", {"test_hooks_follow_fsdp2_order": 1}),
    "reused_unit_placed_by_first_finish": ("4.5", {"test_backward_prefetch_targets": 2}),
    "bias_cut_tp_ways": ("5.1", {"test_row_slice_keeps_each_ranks_input_features_and_the_bias_whole": 1}),
    "g_identity_forward": (
        "5.2",
        {
            "test_g_sums_forward_and_is_the_identity_backward": 2,
            "test_f_and_g_around_a_column_then_row_mlp_equal_one_process": 1,
        },
    ),
    "gradient_without_one_hot": (
        "5.3",
        {"test_vocab_parallel_loss_gradient_is_softmax_minus_onehot_on_this_ranks_columns": 2},
    ),
    "newest_backward_first": ("6.1", {"test_one_f_one_b_holds_at_most_p_minus_s_and_is_the_simulators_1f1b": 2}),
    "loss_held_unscaled": ("6.2", {"test_your_steps_give_one_processs_gradients_with_gpipe_and_1f1b": 3}),
    "degrees_taken_unchecked": ("6.3", {"test_resolve_hsdp_refuses_what_cannot_work_naming_the_numbers": 2}),
    "each_collective_rounded": ("6.4", {"test_hsdp_bytes_per_dim_adds_each_units_collectives": 2}),
    "mask_shaped_four_d": ("0.1", {"test_causal_mask_values": 2}),
    "loss_mask_ignored": (
        "0.2",
        {"test_masked_loss_value": 2, "test_masked_loss_ignores_unmasked_positions_and_has_gradients": 1},
    ),
    "strided_rank_slice": ("0.3", {"test_rank_slices_are_disjoint_and_cover_the_batch": 2}),
    "cosine_one_step_late": ("0.4", {"test_lr_schedule": 2}),
    "copy_reduced_not_the_tensor": (
        "1.1",
        {
            "test_ring_sum_matches_torch[2]": 1,
            "test_ring_sum_matches_torch[3]": 1,
            "test_ring_sum_matches_torch[4]": 1,
            "test_ring_average_and_a_world_of_one": 1,
            "test_ring_leaves_every_rank_with_the_same_bits": 1,
        },
    ),
    "ring_switch_ignored": ("1.3", {"test_ddp_ring_switch_gives_the_same_gradients": 1}),
    "device_change_keeps_the_bucket": ("1.2", {"test_buckets_close_when_they_reach_the_cap": 1}),
    "reduced_flag_left_set": ("2.5", {"test_zero1_sends_the_ring_bytes": 1}),
    "blocks_in_reverse_order": ("3.3", {"test_units_of_each_policy": 2}),
    "shard_a_view_of_full": ("4.1", {"test_shard_rows_pads_and_cuts_equal_shards": 2}),
    "frozen_parameters_left_out": ("4.2", {"test_unit_parameters_frozen_owned_and_every_slot_named": 1}),
    "freed_after_the_reduce_scatter": ("4.3", {"test_hooks_hold_no_more_in_backward_than_the_reference_fsdp": 2}),
    "fused_parts_ignored": ("5.1", {"test_column_slice_keeps_each_ranks_output_features": 1}),
    "exp_unshifted": ("5.3", {"test_vocab_parallel_loss_equals_one_process_on_every_rank": 2}),
    "running_maximum_not_detached": ("5.4", {"test_online_softmax_merges_blocks_into_one_softmax": 2}),
    "last_backward_dropped": (
        "6.1",
        {
            "test_one_f_one_b_runs_every_micro_batch_once_and_never_deadlocks": 3,
            "test_one_f_one_b_holds_at_most_p_minus_s_and_is_the_simulators_1f1b": 2,
        },
    ),
    "backward_from_ones": ("6.2", {"test_your_steps_give_one_processs_gradients_with_gpipe_and_1f1b": 3}),
    "shard_degree_is_the_node": ("6.3", {"test_resolve_hsdp_shards_inside_a_node_and_infers_the_missing_degree": 2}),
    "reshard_flags_dropped": (
        "6.4",
        {"test_hsdp_bytes_per_dim_adds_each_units_collectives": 2, "test_hsdp_bytes_per_dim_equals_what_fsdp2_sent": 2},
    ),
    "every_logit_all_reduced": ("5.3", {"test_vocab_parallel_loss_equals_one_process_on_every_rank": 2}),
}


# the causes graded on their own: a reason that names the learner's line needs the mistake in the graded
# folder's own file; a rank that crashes takes the rest of its launch with it; a prediction is no exercise
SEPARATE_CAUSES = ("chunked_fsdp", "last_rank_index_error", "forgot_the_ring_factor")


def mistake_files() -> dict[str, str]:
    """Every mistake graded one exercise at a time: its file under tests/pitfalls/ (no ``.py``) -> its
    exercise; the rules' files and the named causes' (each cause's folder holds its lab's file)."""
    files = {f"rules/{name}": exercise for name, (exercise, _) in RULES.items()}
    for folder, (exercise, _, _) in NAMED_CAUSES.items():
        if folder not in SEPARATE_CAUSES:
            files[f"{folder}/{impl.EXERCISES[exercise][0]}"] = exercise
    return files


def packed_runs() -> dict[str, dict[str, str]]:
    """The mistakes' gradings, as few as the exercises allow: each grading holds at most one mistake
    per exercise (``grading -> {exercise: file}``), every lab at once: ``--exercise 1.2,4.1,4.2`` grades
    the tests of each, each with only its own exercise the pitfall's (the reference stands in for the
    others), so a test's result is the one a grading of its exercise alone gives."""
    runs: list[dict[str, str]] = []
    for file, exercise in mistake_files().items():
        run = next((r for r in runs if exercise not in r), None)
        if run is None:
            runs.append(run := {})
        run[exercise] = file
    return {f"mistakes {i}": run for i, run in enumerate(runs, 1)}


def graded_alone(graded, file: str) -> tuple[grader.Report, list[grader.Result]]:
    """The report of the grading that holds mistake ``file``, and the results of its exercise."""
    run, files = next((run, files) for run, files in packed_runs().items() if file in files.values())
    report = report_of(graded, run)
    assert {r.exercise for r in report.results} == set(files), report.text
    exercise = next(e for e, f in files.items() if f == file)
    return report, [r for r in report.results if r.exercise == exercise]


@pytest.mark.parametrize("name", list(RULES))
def test_each_stated_rule_broken_alone_loses_exactly_its_tests(graded, name):
    """The rules a stub states, each broken on its own (tests/pitfalls/rules/, one file per mistake; the
    others' rules are in tests/pitfalls/ and its one-mistake folders): the tests of that rule fail, and
    only they. The mistakes of several exercises are graded together, every lab in one grading, and each
    test runs with only its own exercise the pitfall's, so the tests of ``exercise`` are read from that
    grading."""
    exercise, expected = RULES[name]
    assert expected, f"{name}: a rule's pitfall must lose at least one test"
    report, graded_here = graded_alone(graded, f"rules/{name}")
    assert graded_here, f"no test of exercise {exercise} was graded:\n{report.text}"
    assert {r.name: r.points for r in graded_here if not r.passed} == expected, report.text
    assert all(r.kind == "failed" for r in graded_here if not r.passed), report.text


def launch_of(*outcomes: dict | str) -> Launch:
    """A launch of len(outcomes) ranks that ran scenario "s@4.1": each rank's result (a dict), or, for
    a rank that stopped before it reported, its stderr (a str)."""
    results = [{"s@4.1": o} if isinstance(o, dict) else {} for o in outcomes]
    return Launch(results, [o if isinstance(o, str) else "" for o in outcomes])


def failed(error: str, trace: str = "") -> dict:
    return {"ok": False, "error": error, "trace": trace}


def test_the_crashed_ranks_own_error_comes_first_and_the_others_are_its_consequences(monkeypatch):
    monkeypatch.delenv(impl.DIR_ENV_VAR, raising=False)
    mine = impl.exercises_dir() / "lab04_fsdp.py"
    trace = f'Traceback (most recent call last):\n  File "{mine}", line 40, in shard_rows\nIndexError: tuple index out of range'
    launch = launch_of(
        failed("RuntimeError: [/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer"),
        failed("IndexError: tuple index out of range", trace),
    )
    for rank in (0, 1):
        with pytest.raises(AssertionError) as caught:
            scenario(launch, "s@4.1", rank)
        reason = str(caught.value)
        assert reason.startswith(
            "rank 1, s@4.1: IndexError: tuple index out of range (in lab04_fsdp.py, line 40, shard_rows)"
        ), reason
        assert rank == 1 or reason.endswith("(a consequence: rank 1 stopped first)"), reason
        assert ".cc:" not in reason, reason
    # a rank that crashed outright (no result): its stderr's last error and line, first
    crashed = launch_of(
        failed("RuntimeError: Connection reset by peer"),
        f'{trace}\nterminate called after throwing an instance of "c10::Error"\n  what():  boom: bad shard',
    )
    reason = str(pytest.raises(AssertionError, scenario, crashed, "s@4.1", 0).value)
    assert reason.startswith("rank 1 stopped before it reported 's@4.1': boom: bad shard (in lab04_fsdp.py, line 40"), (
        reason
    )
    # a stub on the other rank: not written yet, not a failure
    with pytest.raises(NotImplementedError, match="Exercise 4.1: cut the rows"):
        scenario(
            launch_of(
                failed("RuntimeError: Connection closed by peer"),
                failed("NotImplementedError: Exercise 4.1: cut the rows"),
            ),
            "s@4.1",
            0,
        )


def test_a_time_out_says_which_rank_waited_for_which_and_known_symptoms_their_likely_cause(monkeypatch):
    timeout = "RuntimeError: [../gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting 20000ms for recv operation to complete"
    skipped = str(pytest.raises(AssertionError, scenario, launch_of(failed(timeout), {"ok": True}), "s@4.1", 0).value)
    assert "rank 0 waited 20 s in a collective for rank 1, which finished 's@4.1' without starting it" in skipped, (
        skipped
    )
    both_wait = str(
        pytest.raises(AssertionError, scenario, launch_of(failed(timeout), failed(timeout)), "s@4.1", 1).value
    )
    assert "rank 1 waited 20 s in a collective for rank 0, which was waiting too" in both_wait, both_wait
    freed = "RuntimeError: setStorage: sizes [609, 128], strides [128, 1], storage offset 0, and itemsize 4 requiring a storage size of 311808 are out of bounds for storage of size 0"
    assert "likely cause: a unit's parameters were used while freed" in explain(freed)
    held = "ValueError: stage 1's schedule ended with micro-batches [0, 1, 2, 3] never run backward"
    assert "likely cause: a micro-batch still held at the end of the step" in explain(held)
    monkeypatch.setenv("MINIGPT_LANG", "es")
    assert "causa probable: se usaron los parámetros de una unidad mientras estaban liberados" in explain(freed)
    skipped = str(pytest.raises(AssertionError, scenario, launch_of(failed(timeout), {"ok": True}), "s@4.1", 0).value)
    assert "el rank 0 esperó 20 s en una colectiva al rank 1, que terminó 's@4.1' sin empezarla" in skipped, skipped


def test_a_time_limit_is_reported_as_one_not_as_a_wrong_answer(graded):
    """A causal mask that never returns, under limits scaled down to a twentieth (1.5 s instead of
    30 s): the lost points say it ran out of time, with the limit and how to raise it."""
    report = report_of(graded, "time_limit")
    assert [r.kind for r in report.results] == ["time limit", "time limit"], report.text
    assert "ran out of time (it did not fail): Failed: Timeout (>1.5s)" in report.text, report.text
    assert "MINIGPT_TIME_SCALE=3 make grade" in report.text, report.text


def test_ranks_that_could_not_connect_lose_no_point(graded):
    """A busy machine, not a mistake: rank 1 of Exercise 1.3's launch starts 8 s late, beyond a start-up
    timeout of 3 s. Every test of the exercise is reported as not graded, with the line that says the
    ranks could not connect and how to raise the limit, and none of its points is lost."""
    report = report_of(graded, "could_not_connect")  # the reference's code of 1.3, as the learner's
    assert report.results and all(r.kind == grader.NOT_GRADED for r in report.results), report.text
    assert report.total == report.earned == 0 and lost(report) == {}
    assert "not graded (" in report.text and "pt, not lost)" in report.text, report.text
    assert "could not connect to the other" in report.text and "raise --timeout or MINIGPT_TIME_SCALE" in report.text
    assert "pt not graded: run again, e.g. make grade EX=1.3" in report.text, report.text
    assert "−" not in report.text, report.text  # no "−N pt" line


# ----------------------------------------------------------------------------------------------
# the words: Spanish, the catalog, the stubs


def test_the_report_speaks_spanish_when_asked(graded):
    report = report_of(graded, "spanish")
    assert "Laboratorio 00 · MiniGPT y la referencia de un proceso · 0/4" in report.text, report.text
    assert "Ejercicio 0.1 · la máscara causal · 0/4" in report.text, report.text
    assert "sin escribir todavía: Ejercicio 0.1: construye la máscara causal booleana" in report.text, report.text
    assert "Corrigiendo tu código" in report.text and "Total 0/4 puntos" in report.text
    assert "not written" not in report.text and "Exercise" not in report.text and "Lab " not in report.text


def stub_tasks() -> dict[str, list[str]]:
    """exercise -> the task lines its stubs raise (``NotImplementedError("Exercise 1.3: ...")``)."""
    found: dict[str, list[str]] = {}
    for path in sorted(impl.EXERCISES_DIR.glob("lab*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call):
                if getattr(node.exc.func, "id", "") == "NotImplementedError":
                    number, _, task = ast.literal_eval(node.exc.args[0]).partition(": ")
                    found.setdefault(number.removeprefix("Exercise "), []).append(task)
    return found


def test_the_catalog_matches_the_stubs_and_the_tests():
    catalog = grader.catalog()
    assert set(catalog["labs"]) == set(LABS) and all(catalog["labs"][lab]["en"] == title for lab, title in LABS.items())
    assert list(catalog["exercises"]) == list(impl.EXERCISES)
    tasks = stub_tasks()
    for question in predictions.QUESTIONS:  # a prediction's stub is None; its line is predictions.task's
        tasks[question] = [predictions.task(question).partition(": ")[2]]
    assert set(tasks) == set(impl.EXERCISES)
    for exercise, entry in catalog["exercises"].items():
        assert sorted(t["en"] for t in entry["tasks"]) == sorted(tasks[exercise]), exercise
        assert all(t["es"] and t["es"] != t["en"] for t in entry["tasks"]), exercise
        assert entry["title"]["en"] and entry["title"]["es"], exercise
    for lab in LABS:
        exercises = [exercise for _, exercise, _, _ in graded_tests(lab)]
        assert None not in exercises, f"Lab {lab}: a graded test without @pytest.mark.exercise"
        assert "all" in exercises, f"Lab {lab}: no end-to-end test"
        exercises += [q for q, question in predictions.QUESTIONS.items() if question.lab == lab]
        mine = {e for e in impl.EXERCISES if impl.lab_of(e) == lab}
        assert set(exercises) == mine | {"all"}, f"Lab {lab}: exercises without tests or tests without exercises"


def test_stubs_have_the_reference_signatures():
    for module, names in impl.REFERENCE.items():
        for name in names:
            ref = impl.reference(module, name)
            stub = getattr(impl._import_file(impl.EXERCISES_DIR / f"{module}.py"), name)
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


def test_one_exercise_is_the_learners_and_the_reference_stands_in_for_the_rest(monkeypatch):
    from minigpt.parallel import ddp, ring

    monkeypatch.delenv(impl.DIR_ENV_VAR, raising=False)
    monkeypatch.setenv(impl.ONLY_ENV_VAR, "1.3")
    learners = impl.load("lab01_ddp", "BucketedDDP", "exercises")
    assert learners._launch is not ddp.BucketedDDP._launch  # the stub of 1.3
    assert learners.finish_gradient_synchronization is ddp.BucketedDDP.finish_gradient_synchronization
    assert learners.assign_buckets is ddp.assign_buckets
    assert impl.load("lab01_ddp", "ring_all_reduce", "exercises") is ring.ring_all_reduce
    monkeypatch.setenv(impl.ONLY_ENV_VAR, "9.9")
    with pytest.raises(ValueError, match="MINIGPT_EXERCISE='9.9' is not an exercise"):
        impl.load("lab01_ddp", "ring_all_reduce", "exercises")


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


def test_several_exercises_can_be_selected_and_an_unknown_one_is_refused():
    """``--exercise 4.1,4.5`` is how the rule folders are graded, one run per lab (each rule test
    checks that its run graded exactly the folder's exercises of that lab); a list with one unknown
    name is a usage error that names it."""
    from tests.conftest import selected_exercises

    assert selected_exercises("4.1,4.5") == {"4.1", "4.5"} == selected_exercises(" 4.5 , 4.1")
    assert selected_exercises("all") == {"all"}
    with pytest.raises(pytest.UsageError, match=r"'9\.9' is not an exercise"):
        selected_exercises("4.1,9.9")


def test_a_session_that_grades_the_reference_leaves_the_graded_tests_to_that_grading():
    """``make test`` runs each graded test once per implementation: with the reference grading
    (``reference_graded``) selected, the session's own copies of the graded tests are deselected
    (that grading runs every one of them); without it, or grading the learner's code, or one exercise,
    or for the grader itself (``--grade-report``), they run in place."""
    from types import SimpleNamespace

    from tests.conftest import _GradedOnTheLane, graded_on_the_lane

    class Config:
        def __init__(self, **options):
            self.options = {"--impl": "reference", "--exercise": None, "--grade-report": None, **options}
            self.stash, self.deselected = pytest.Stash(), []
            self.hook = SimpleNamespace(pytest_deselected=lambda items: self.deselected.extend(items))

        def getoption(self, name):
            return self.options[name]

    def item(name: str, fixtures: tuple = (), points: bool = False):
        marker = object() if points else None
        return SimpleNamespace(name=name, fixturenames=fixtures, get_closest_marker=lambda m: marker)

    grading = item("full marks", ("reference_graded",))
    graded = [item("ring", points=True), item("buckets", points=True)]
    other = item("pages")
    assert graded_on_the_lane(Config(), [grading, other, *graded])
    assert not graded_on_the_lane(Config(), [other, *graded])  # nothing reads the grading
    for options in ({"--impl": "exercises"}, {"--exercise": "4.1"}, {"--grade-report": "out.json"}):
        assert not graded_on_the_lane(Config(**options), [grading, *graded]), options
    config, items = Config(), [grading, graded[0], other, graded[1]]
    _GradedOnTheLane().pytest_collection_modifyitems(config, items)
    assert [i.name for i in items] == ["full marks", "pages"] and config.deselected == graded
    config, items = Config(**{"--impl": "exercises"}), [grading, *graded]
    _GradedOnTheLane().pytest_collection_modifyitems(config, items)
    assert len(items) == 3 and config.deselected == []


def test_a_correct_test_is_never_charged_for_a_crash_in_an_earlier_one(monkeypatch):
    """Rank 1 raised in its own code in scenario "reduce@4.4" (rank 0, waiting for it, saw the connection
    close); then both failed "norm@4.4" with consequences only: "reduce@4.4" is charged with rank 1's error and
    line, "norm@4.4" is not graded and says why, naming the scenario and rank 1's error. A rank that died
    in an earlier scenario makes every later one not graded too."""
    monkeypatch.delenv(impl.DIR_ENV_VAR, raising=False)
    monkeypatch.delenv(DETAILS_VARIABLE, raising=False)
    mine = impl.exercises_dir() / "lab04_fsdp.py"
    trace = f'Traceback (most recent call last):\n  File "{mine}", line 152, in reduce_gradients\nIndexError: index 2 is out of bounds'
    closed = failed("RuntimeError: [../gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:123")
    timeout = failed("RuntimeError: [../gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting 20000ms for recv")
    launch = Launch(
        [
            {"reduce@4.4": closed, "norm@4.4": timeout},
            {"reduce@4.4": failed("IndexError: index 2 is out of bounds", trace), "norm@4.4": closed},
        ],
        ["", ""],
    )
    charged = str(pytest.raises(AssertionError, scenario, launch, "reduce@4.4", 0).value)
    assert charged.startswith("rank 1, reduce@4.4: IndexError: index 2 is out of bounds (in lab04_fsdp.py, line 152"), (
        charged
    )
    for rank in (0, 1):
        skipped = pytest.raises(pytest.skip.Exception, scenario, launch, "norm@4.4", rank).value
        reason = str(skipped.msg)
        assert reason.startswith(f"{NOT_GRADED}: it ran after 'reduce@4.4', where rank 1, reduce@4.4: IndexError"), (
            reason
        )
        assert "(in lab04_fsdp.py, line 152, reduce_gradients)" in reason and "fix that one first" in reason, reason
    died = Launch(
        [{"reduce@4.4": closed, "norm@4.4": closed}, {}], ["", f"{trace}\nIndexError: index 2 is out of bounds"]
    )
    charged = str(pytest.raises(AssertionError, scenario, died, "reduce@4.4", 0).value)
    assert charged.startswith("rank 1 stopped before it reported 'reduce@4.4': IndexError"), charged
    reason = str(pytest.raises(pytest.skip.Exception, scenario, died, "norm@4.4", 0).value.msg)
    assert reason.startswith(f"{NOT_GRADED}: it ran after 'reduce@4.4', where rank 1 stopped"), reason
    # make grade DETAILS=1: the crashed rank's own traceback follows its line
    monkeypatch.setenv(DETAILS_VARIABLE, "1")
    assert trace in str(pytest.raises(AssertionError, scenario, launch, "reduce@4.4", 0).value)


def test_a_deadlock_says_where_each_rank_was_in_the_learners_code(monkeypatch):
    monkeypatch.delenv(impl.DIR_ENV_VAR, raising=False)
    mine = impl.exercises_dir() / "lab04_fsdp.py"

    def stuck(line: int, function: str) -> dict:
        trace = f'Traceback (most recent call last):\n  File "{mine}", line {line}, in {function}\nRuntimeError: x'
        return failed("RuntimeError: [../gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting 20000ms", trace)

    launch = Launch(
        [{"hooks@4.3": stuck(180, "after_backward")}, {"hooks@4.3": stuck(171, "before_backward")}], ["", ""]
    )
    reason = str(pytest.raises(AssertionError, scenario, launch, "hooks@4.3", 0).value)
    assert "rank 0 waited 20 s in a collective for rank 1, which was waiting too" in reason, reason
    assert (
        "where each rank was: rank 0 (in lab04_fsdp.py, line 180, after_backward); "
        "rank 1 (in lab04_fsdp.py, line 171, before_backward)" in reason
    ), reason
