"""No mistake here: each prediction is what the code measures. This folder's mistakes are in its code, so a
whole lab graded from it loses exactly their points (a missing answer would lose the predictions' too)."""

from minigpt.runners import predictions as _predictions


def __getattr__(name: str):
    return _predictions.measure(name.replace("_", "."))  # P1_1 -> P1.1, measured when the grading reads it
