"""The graded tests' messages in the learner's language: ``say(english, spanish)`` returns the one
``MINIGPT_LANG`` asks for (``es``: Spanish; anything else: English). The grader (``python -m
minigpt.grader --lang es``, ``make grade LANG=es``) sets it for the tests it runs."""

from __future__ import annotations

import os

VARIABLE = "MINIGPT_LANG"


def spanish() -> bool:
    return os.environ.get(VARIABLE, "").lower().startswith("es")


def say(english: str, spanish_text: str) -> str:
    return spanish_text if spanish() else english
