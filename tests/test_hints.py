"""``make hint``: every exercise has hints in both languages, and the command walks them in order.

The stubs state the task (what, the contract, why); the steps are the hints of the catalog
(``minigpt/exercises.toml``), one per call of ``make hint EX=4.3`` (``python -m minigpt.hints``),
their progress kept in a small file under ``out/``. Maintainer checks: no points.
"""

from __future__ import annotations

import re
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


def test_every_exercise_has_hints_in_each_language():
    catalog = grader.catalog()["exercises"]
    assert list(catalog) == list(impl.EXERCISES)
    for exercise, entry in catalog.items():
        found = entry.get("hints", [])
        assert len(found) >= 3, f"Exercise {exercise}: {len(found)} hints, expected at least 3 (a ladder)"
        for n, h in enumerate(found, 1):
            assert h.get("en", "").strip() and h.get("es", "").strip(), f"Exercise {exercise}, hint {n}: en and es"
            assert h["en"] != h["es"], f"Exercise {exercise}, hint {n}: the Spanish is the English"


# --- the ladder climbs: a question, then a pointer, code only from the third hint on -------------

BACKTICKED = re.compile(r"`[^`]*`")
CALL = re.compile(r"[\w.]+\([^()]*\)?")  # f(x), torch.tril(...), id(p): a name right against its bracket
INDEXING = re.compile(r"[\w.]+\[[^\[\]]*\]?")  # mask[i, j], blocks[k]
# j <= i, x = 1, a -> b (with the operands on either side, for the report), 2^p, $x$
ALWAYS_FORMULA = re.compile(r"\S+ [=<>^$≤≥≠]+ \S+|\S*[=<>^$≤≥≠]\S*")
# + or * with an operand on each side, both right against it (2*N) or both one space away (a + b);
# an emphasis star has a word on one side only (*bucket*), so it is prose
ARITHMETIC = re.compile(r"[\w.)\]]+[+*][\w.(\[]+|[\w.)\]]+ [+*] [\w.(\[]+")
SLASH = re.compile(r"([\w.()\[\]-]+)( ?)/( ?)([\w.()\[\]-]+)")
NUMBER_OR_LETTER = re.compile(r"\d+(?:[.,]\d+)?|[A-Za-z]")
PROSE_SLASHES = {"y/o", "e/o"}  # Spanish "and/or": two one-letter words, not a division
HINT2_CODE_IN_BACKTICKS = re.compile(r"[()\[\]=+*/<>]")


def _divides(left: str, right: str) -> bool:
    """Whether ``left/right`` is a division: a number, a single letter or a bracket on one side."""
    if left.endswith((")", "]")) or right.startswith(("(", "[")):
        return True
    return any(NUMBER_OR_LETTER.fullmatch(side) for side in (left.lstrip("([-"), right.rstrip(".,)]")))


def formulas(text: str) -> list[str]:
    """The formulas in ``text`` (the rules are in :func:`test_every_hint_ladder_climbs`'s docstring)."""
    found = [m.group(0) for m in ALWAYS_FORMULA.finditer(text)]
    found += [m.group(0) for m in ARITHMETIC.finditer(text)]
    for m in SLASH.finditer(text):
        left, before, after, right = m.groups()
        if before == after and m.group(0).lower() not in PROSE_SLASHES and _divides(left, right):
            found.append(m.group(0))
    return found


def ladder_faults(level: int, text: str) -> list[tuple[str, str]]:
    """What is wrong with ``text`` as hint number ``level``: ``(rule, offending text)`` pairs. Hint 3 and
    later may hold anything."""
    if level == 1:
        faults = [("backticks (code) in a first hint", m.group(0)) for m in BACKTICKED.finditer(text)]
        prose = text
    elif level == 2:
        faults = [
            ("an expression in backticks (a second hint names things only)", m.group(0))
            for m in BACKTICKED.finditer(text)
            if HINT2_CODE_IN_BACKTICKS.search(m.group(0))
        ]
        prose = BACKTICKED.sub(" ", text)
    else:
        return []
    faults += [("call syntax", m.group(0)) for m in CALL.finditer(text)]
    faults += [("indexing", m.group(0)) for m in INDEXING.finditer(prose)]
    faults += [("a formula", found) for found in formulas(prose)]
    return faults


@pytest.mark.parametrize("exercise", list(grader.catalog()["exercises"]))
def test_every_hint_ladder_climbs(exercise):
    """Hints climb (DESIGN.md, "Exercises and grading"): at least three per exercise in each language;
    hint 1 a question or a concept, hint 2 a pointer, code only from hint 3 on.

    * Hint 1 holds no code: no backticks, no call syntax (a name right against an opening bracket:
      ``f(x)``, ``id(p)``, ``torch.tril(``; "a (B, T) tensor" is prose), no indexing (``mask[i, j]``),
      no formula.
    * Hint 2 may name things in backticks (`bucket_cap_mb`, `torch.tril`, `self._next_bucket`), but no
      backticked span holds ( ) [ ] = + * / < >, and no call syntax appears anywhere in the hint;
      outside the backticks, no indexing and no formula, as in hint 1.
    * A formula is any of = < > ^ $ ≤ ≥ ≠ (an ordinary sentence needs none of them: "j <= i",
      "x = 1", "2^p", "$x$", "a -> b"); a + or * with an operand on each side, both right against it
      ("2*N") or both one space away ("a + b"), so an emphasis star ("*bucket*") is prose; a slash with
      both sides right against it or both one space away, and a number, a single letter or a bracket
      on one side ("B/N", "1/p", "(N-1)/N", "x / 2"). A slash between words is prose ("and/or",
      "reduce-scatter/all-gather", "entrenamiento / validación"), and so is the Spanish "y/o" ("e/o").
      A hyphen never is ("all-gather", "p-th"; write "N minus 1" all the same).

    Each failure names the exercise, the hint, the language, the rule broken and the offending text,
    then the whole hint.
    """
    found = grader.catalog()["exercises"][exercise].get("hints", [])
    problems = []
    for lang in hints.LANGS:
        if len(found) < 3:
            problems.append(f"Exercise {exercise} ({lang}): {len(found)} hints, at least 3 (question, pointer, steps)")
        for n, entry in enumerate(found[:2], 1):
            text = entry.get(lang, "")
            for rule, offending in ladder_faults(n, text):
                problems.append(f"Exercise {exercise}, hint {n} ({lang}): {rule}: {offending!r} in {text!r}")
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize(
    ("level", "text", "faults"),
    [
        (1, "Which keys may query i see, and/or which not? A half-cosine, y/o an all-gather (and/or both).", []),
        (1, "What is a *bucket* for? A (B, T) tensor, 1.88 GB, 7.5B, entrenamiento / validación, N-1.", []),
        (1, "Think of `torch.tril`.", ["`torch.tril`"]),
        (1, "B/N rows, 1/p, (N-1)/N, x / 2, x/(N+1).", ["B/N", "1/p", "(N-1)/N", "x / 2", "x/(N", "N+1"]),
        (1, "True where j <= i, so x = 1, 2^p, $x$ and a -> b.", ["j <= i,", "x = 1,", "2^p,", "$x$", "->"]),
        (1, "Add a + b, then 2*N, then id(p) and mask[i, j].", ["a + b", "2*N", "id(p)", "mask[i, j]"]),
        (2, "`torch.tril` keeps the lower triangle of a (size, size) matrix, `bucket_cap_mb` per bucket.", []),
        (
            2,
            "Use `torch.tril(x)` on `a + b`, or `flat[s0:s1]`.",
            ["`torch.tril(x)`", "`a + b`", "`flat[s0:s1]`", "torch.tril(x)"],
        ),
        (2, "Call torch.tril(x) where j <= i.", ["torch.tril(x)", "j <= i."]),
        (3, "`torch.ones(size, size, dtype=torch.bool).tril()`: mask[i, j] == (j <= i).", []),
    ],
)
def test_the_hint_ladder_rules_tell_prose_from_code(level, text, faults):
    """The rules of :func:`test_every_hint_ladder_climbs` let ordinary sentences through and catch code."""
    found = [offending for _, offending in ladder_faults(level, text)]
    assert sorted(found) == sorted(faults), found


def test_the_hint_command_walks_the_hints_in_order_then_shows_them_all(state, capsys):
    expected = hints.hints_of("4.3")
    for n, text in enumerate(expected, 1):
        assert hints.main(["4.3"]) == 0
        out = capsys.readouterr().out
        assert f"Exercise 4.3 · the four moves of a unit · hint {n} of {len(expected)}:" in out, out
        assert text in out and all(other not in out for other in expected if other != text), out
    assert hints.main(["4.3"]) == 0  # after the last: all of them, in order, and how to start over
    out = capsys.readouterr().out
    assert out.index(expected[0]) < out.index(expected[-1]) and "RESET=1" in out, out
    assert hints.main(["0.1"]) == 0 and "hint 1 of" in capsys.readouterr().out  # each exercise its own count
    assert hints.main(["4.3", "--reset"]) == 0 and "start over" in capsys.readouterr().out
    assert hints.main(["4.3", "--lang", "es"]) == 0
    out = capsys.readouterr().out
    assert (
        "Ejercicio 4.3 · los cuatro movimientos de una unidad · pista 1 de" in out
        and hints.hints_of("4.3", "es")[0] in out
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
