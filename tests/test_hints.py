"""``make hint``: every exercise has hints in both languages, and the command walks them in order.

The stubs state the task (what, the contract, why); the steps are the hints of the catalog
(``minigpt/exercises.toml``), one per call of ``make hint EX=4.3`` (``python -m minigpt.hints``),
their progress kept in a small file under ``out/``. Maintainer checks: no points.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from minigpt import grader, hints, impl
from tests.launcher import ROOT


@pytest.fixture
def state(monkeypatch, tmp_path):
    path = tmp_path / "hints.json"
    monkeypatch.setenv(hints.STATE_VARIABLE, str(path))
    return path


def test_every_exercise_has_at_least_two_hints_in_each_language():
    catalog = grader.catalog()["exercises"]
    assert list(catalog) == list(impl.EXERCISES)
    for exercise, entry in catalog.items():
        found = entry.get("hints", [])
        assert len(found) >= 2, f"Exercise {exercise}: {len(found)} hints, expected at least 2"
        for n, h in enumerate(found, 1):
            assert h.get("en", "").strip() and h.get("es", "").strip(), f"Exercise {exercise}, hint {n}: en and es"
            assert h["en"] != h["es"], f"Exercise {exercise}, hint {n}: the Spanish is the English"


def test_the_hint_command_walks_the_hints_in_order_then_shows_them_all(state, capsys):
    expected = hints.hints_of("4.3")
    for n, text in enumerate(expected, 1):
        assert hints.main(["4.3"]) == 0
        out = capsys.readouterr().out
        assert f"Exercise 4.3 · the four hooks of a unit · hint {n} of {len(expected)}:" in out, out
        assert text in out and all(other not in out for other in expected if other != text), out
    assert hints.main(["4.3"]) == 0  # after the last: all of them, in order, and how to start over
    out = capsys.readouterr().out
    assert out.index(expected[0]) < out.index(expected[-1]) and "RESET=1" in out, out
    assert hints.main(["0.1"]) == 0 and "hint 1 of" in capsys.readouterr().out  # each exercise its own count
    assert hints.main(["4.3", "--reset"]) == 0 and "start over" in capsys.readouterr().out
    assert hints.main(["4.3", "--lang", "es"]) == 0
    out = capsys.readouterr().out
    assert (
        "Ejercicio 4.3 · los cuatro hooks de una unidad · pista 1 de" in out and hints.hints_of("4.3", "es")[0] in out
    )
    assert state.is_file()


def test_a_bad_exercise_is_one_line_that_names_it_and_the_valid_ones(state):
    proc = subprocess.run(
        [sys.executable, "-m", "minigpt.hints", "9.9"], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 2 and proc.stdout == "", proc
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "EX=9.9: no exercise 9.9; choose one of 0.1, 0.2" in lines[0], proc.stderr
    assert hints.main([]) == 2 and not state.exists()  # no exercise at all: said, nothing written
    assert hints.main(["4.3", "--lang", "fr"]) == 2


def test_a_notebooks_hint_shows_once(state, capsys):
    """hint() prints the hint and returns nothing: a notebook cell shows it once, not again as an Out[] string."""
    assert hints.hint("0.1", lang="en") is None
    out = capsys.readouterr().out
    assert out.count(hints.hints_of("0.1")[0]) == 1, out
