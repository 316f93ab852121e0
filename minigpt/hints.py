"""Hints for the exercises, one at a time, for when you are stuck.

    make hint EX=4.3                # the first hint of Exercise 4.3 (python -m minigpt.hints 4.3)
    make hint EX=4.3                # ... the second, then the third on later calls
    make hint EX=4.3 LANG=es        # en español (--lang es)
    make hint EX=4.3 RESET=1        # start over from the first (--reset)

A stub in ``lab/exercises/`` states its task: what the function must achieve, its contract and why it
matters. The hints are the steps, from a nudge to the recipe: each call prints the next one, and
after the last it prints them all again. They come from the catalog (``minigpt/exercises.toml``,
each exercise's ``hints``, in English and Spanish). How many you have seen of each exercise is kept
in ``out/hints.json`` (git-ignored; ``MINIGPT_HINTS_FILE`` names another file). In a notebook:
``hint("4.3")`` prints the next hint and returns it.

Exit status: 0, or 2 for a bad option (an exercise that does not exist is named, with the ones that do).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from minigpt import cli

ROOT = Path(__file__).resolve().parent.parent
STATE_VARIABLE = "MINIGPT_HINTS_FILE"
LANGS = ("en", "es")

WORDS = {
    "en": {
        "hint": "Exercise {ex} · {title} · hint {n} of {of}:",
        "more": "(make hint EX={ex} for the next one)",
        "last": "(that was the last one; make hint EX={ex} RESET=1 starts over)",
        "all": "Exercise {ex} · {title} · all {of} hints:",
        "reset": "Exercise {ex}: the hints start over from the first.",
    },
    "es": {
        "hint": "Ejercicio {ex} · {title} · pista {n} de {of}:",
        "more": "(make hint EX={ex} para la siguiente)",
        "last": "(era la última; make hint EX={ex} RESET=1 vuelve a empezar)",
        "all": "Ejercicio {ex} · {title} · las {of} pistas:",
        "reset": "Ejercicio {ex}: las pistas vuelven a empezar por la primera.",
    },
}


def exercises() -> dict:
    from minigpt.grader import catalog  # the grader's catalog reader (and its TOML import)

    return catalog()["exercises"]


def hints_of(exercise: str, lang: str = "en") -> list[str]:
    """Every hint of ``exercise``, in order, in ``lang``."""
    return [entry[lang] for entry in exercises()[exercise].get("hints", [])]


def state_file() -> Path:
    return Path(os.environ.get(STATE_VARIABLE) or ROOT / "out" / "hints.json")


def _seen() -> dict[str, int]:
    try:
        data = json.loads(state_file().read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}  # none yet, or a file this module did not write: start over
    return {k: v for k, v in data.items() if isinstance(v, int)} if isinstance(data, dict) else {}


def _save(seen: dict[str, int]) -> None:
    path = state_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(seen, indent=1, sort_keys=True) + "\n", encoding="utf-8")


def reset(exercise: str, lang: str = "en") -> str:
    """Start ``exercise``'s hints over; returns the line that says so."""
    seen = _seen()
    seen.pop(exercise, None)
    _save(seen)
    return WORDS[lang]["reset"].format(ex=exercise)


def next_hint(exercise: str, lang: str = "en") -> str:
    """The text of ``exercise``'s next hint (and count it as seen); after the last, all of them."""
    words, hints = WORDS[lang], hints_of(exercise, lang)
    title = exercises()[exercise]["title"][lang]
    seen = _seen()
    shown = seen.get(exercise, 0)
    if shown >= len(hints):
        lines = [words["all"].format(ex=exercise, title=title, of=len(hints))]
        lines += [f"{n}. {text}" for n, text in enumerate(hints, 1)]
        return "\n".join([*lines, words["last"].format(ex=exercise)])
    seen[exercise] = shown + 1
    _save(seen)
    lines = [words["hint"].format(ex=exercise, title=title, n=shown + 1, of=len(hints)), hints[shown]]
    lines.append(words["more" if shown + 1 < len(hints) else "last"].format(ex=exercise))
    return "\n".join(lines)


def hint(exercise: str, lang: str | None = None) -> None:
    """For a notebook: print ``exercise``'s next hint. It returns nothing, so that Jupyter does not show
    the same text a second time as the cell's value (a quoted string with its newlines as ``\\n``)."""
    from minigpt.grader import language

    print(next_hint(_check(exercise), language(lang)), flush=True)


def _check(exercise: str) -> str:
    if exercise not in exercises():
        raise ValueError(_unknown(exercise))
    return exercise


def _unknown(exercise: str) -> str:
    return f"no exercise {exercise}; choose one of {', '.join(exercises())}"


def main(argv: list[str] | None = None) -> int:
    from minigpt.grader import language

    parser = cli.ArgumentParser(
        prog="python -m minigpt.hints",
        name="make hint",
        description="The next hint of one exercise (each call prints the next one).",
    )
    parser.add_argument("exercise", nargs="?", help="the exercise, e.g. 4.3 (make hint EX=4.3)")
    parser.add_argument("--reset", action="store_true", help="start this exercise's hints over")
    parser.add_argument("--lang", help="en or es (default: MINIGPT_LANG, then LANG, then en)")
    args = parser.parse_args(argv)
    if not args.exercise:
        return cli.refuse(parser.name, f"say which exercise: make hint EX=4.3 (one of {', '.join(exercises())})")
    if args.exercise not in exercises():
        return cli.refuse(parser.name, f"EX={args.exercise}: {_unknown(args.exercise)}")
    if args.lang is not None and args.lang.strip().lower()[:2] not in LANGS:
        return cli.refuse(parser.name, f"LANG={args.lang}: choose en or es")
    lang = language(args.lang)
    print(reset(args.exercise, lang) if args.reset else next_hint(args.exercise, lang), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
