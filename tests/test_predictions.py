"""Predict, then run (minigpt/predictions.py): every lab's predictions, graded against what the code measures
on this machine, and the course's own checks of the questions.

Each graded test reads the learner's answer (``lab/exercises/predictions.py``), runs the code that measures
the same number, and compares them; a wrong answer loses its point with what was measured, an unanswered
one is "not written yet". The grader runs this file with each lab's (``--labs``).
"""

from __future__ import annotations

import pytest

from minigpt import impl, predictions
from minigpt.runners import predictions as runner
from minigpt.zero import analytic, pipeline
from tests.words import say, spanish

GRADED = [
    pytest.param(
        question,
        marks=[pytest.mark.lab(q.lab), pytest.mark.exercise(question), pytest.mark.points(1)],
        id=question,
    )
    for question, q in predictions.QUESTIONS.items()
]


def shown(value) -> str:
    """A number as the report's language writes it (2,030,208 / 2 030 208; 0.27 / 0,27), a list of ranks as it is."""
    from minigpt.pages.lang import num

    lang = "es" if spanish() else "en"
    if isinstance(value, list):
        return "[" + ", ".join(map(str, value)) + "]"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, float) and not value.is_integer():
        return num(value, lang, 4).rstrip("0")
    return num(value, lang)


@pytest.mark.parametrize("question", GRADED)
def test_your_prediction_is_what_the_code_measures(question):
    answer = runner.answer(question)  # NotAnswered (a NotImplementedError) while it is None
    measured = runner.measure(question)
    tolerance = predictions.QUESTIONS[question].tolerance
    within = say(f" (within {tolerance:g})", f" (con un margen de {tolerance:g})") if tolerance else ""
    assert predictions.judge(question, answer, measured), say(
        f"you predicted {shown(answer)}; this run measured {shown(measured)}{within}",
        f"predijiste {shown(answer)}; esta ejecución midió {shown(measured)}{within}",
    )


# ----------------------------------------------------------------------------------------------
# The course's own checks (no points)


def test_every_measurement_is_what_the_model_says():
    """What the code measures, held against the course's formulas, computed here apart from the code."""
    ring = 2 * 3 / 4 * 2_030_208
    mlp_bytes = 1_864 * 4 * 7 / 8  # one half of a ring all-reduce of the MLP on 8 workers
    expected = {
        "P1.1": ring,
        "P2.1": 2 * mlp_bytes,  # DDP's: a reduce-scatter and an all-gather
        "P2.2": 3 * mlp_bytes,  # 1.5 times DDP's
        "P3.1": 4 + 1 + 4,
        "P3.2": 4 + 1,
        "P6.1": analytic.bubble_fraction(4, 8),
        "P6.2": 4,
        "P7.1": [4, 5],
        "P7.2": [5, 7],
    }
    for question, value in expected.items():
        assert predictions.judge(question, value, runner.measure(question)), question
    assert pipeline.peak_in_flight(pipeline.simulate("gpipe", 4, 8), 0) == 8  # the explanation's GPipe figure


def test_our_fsdp_and_the_parallel_models_measure_their_byte_models():
    """Lab 04's bytes against the runner's byte model, P4.2 against the blocks held at each peak,
    tensor and context parallelism's against their own formulas."""
    from minigpt.parallel.tensor_parallel.context_parallel import cp_bytes_per_step
    from minigpt.parallel.tensor_parallel.model import tp_bytes_per_step
    from minigpt.runners.lab04_fsdp import model_bytes
    from minigpt.train import TrainConfig, build_model

    cfg = TrainConfig()
    assert runner.measure("P4.1") == model_bytes(cfg, 4)
    # the peaks in blocks: the last block's backward, 4 whole and a full gradient, against block 1's,
    # itself, its gradient and block 0 prefetched, with the gradient shards of blocks 3 and 2
    assert runner.measure("P4.2") == (4 + 1) - (3 + 2 * 1 / 4)
    assert runner._our_fsdp_step(False, 2).peak_held - runner._our_fsdp_step(True, 2).peak_held == 4 * sum(
        p.numel() for p in build_model(cfg).blocks[0].parameters()
    ), "on 2 ranks the shards are halves: exactly one block more"
    assert runner.measure("P5.1") == tp_bytes_per_step(cfg.batch_size, cfg.block_size, cfg.n_embd, cfg.n_layer, 2)
    head_dim = cfg.n_embd // cfg.n_head
    assert runner.measure("P5.2") == cp_bytes_per_step(
        cfg.batch_size, cfg.n_head, cfg.block_size, head_dim, cfg.n_layer, 2
    )


def test_every_lab_from_01_has_two_predictions_and_each_has_its_words():
    labs = [q.lab for q in predictions.QUESTIONS.values()]
    assert {lab: labs.count(lab) for lab in labs} == {f"0{n}": 2 for n in range(1, 8)}
    for question, q in predictions.QUESTIONS.items():
        assert question in impl.EXERCISES and impl.lab_of(question) == q.lab
        for text in (q.title, q.ask, q.why):
            assert text["en"].strip() and text["es"].strip() and text["en"] != text["es"], question


def test_the_learners_file_ships_with_every_question_unanswered():
    assert (impl.EXERCISES_DIR / "predictions.py").read_text(encoding="utf-8") == predictions.stub_text()


def test_an_answer_is_judged_exactly_or_within_its_tolerance():
    assert predictions.judge("P6.1", 0.27, 3 / 11) and predictions.judge("P6.1", 3 / 11, 3 / 11)
    assert not predictions.judge("P6.1", 0.25, 3 / 11) and not predictions.judge("P6.1", float("nan"), 3 / 11)
    assert predictions.judge("P1.1", 3_045_312, 3_045_312.0) and not predictions.judge("P1.1", 3_045_311, 3_045_312)
    assert predictions.judge("P7.1", (4, 5), [4, 5]) and not predictions.judge("P7.1", [5, 4], [4, 5])
    assert not predictions.judge("P1.1", True, 1) and not predictions.judge("P1.1", "3045312", 3_045_312)


def test_a_notebook_writes_its_answer_into_the_learners_file(tmp_path, monkeypatch):
    (tmp_path / "predictions.py").write_text(predictions.stub_text(), encoding="utf-8")
    monkeypatch.setenv(impl.DIR_ENV_VAR, str(tmp_path))
    monkeypatch.setenv(impl.ENV_VAR, "exercises")
    with pytest.raises(predictions.NotAnswered, match="Prediction P7.1: write your answer as P7_1"):
        runner.answer("P7.1")
    predictions.predict("P7.1", (4, 5))
    predictions.predict("P6.1", 0.27)
    assert runner.answer("P7.1") == [4, 5] and runner.answer("P6.1") == 0.27
    assert "P7_1 = [4, 5]" in (tmp_path / "predictions.py").read_text(encoding="utf-8")
    with pytest.raises(ValueError, match="'P9.9' is not a prediction"):
        predictions.predict("P9.9", 1)
