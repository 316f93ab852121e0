"""The grader: your exercises' points, per lab and per exercise, and one line for each lost point.

    make grade                      # every lab (python -m minigpt.grader)
    make grade EX=1.3               # one exercise, in seconds (--exercise 1.3)
    make grade LAB=01               # one lab (--lab 01)
    make grade LANG=es              # el informe en español (--lang es)
    make grade DETAILS=1            # pytest's own output too, tracebacks included (--details)

It runs the graded tests only (``tests/test_lab00.py`` ... ``tests/test_lab03.py``, the tests with
points) against your code in ``lab/exercises/`` (``--impl exercises``, or the folder
``MINIGPT_EXERCISES_DIR`` names), each exercise with the reference standing in for the others (see
``minigpt/impl.py``), so an exercise earns its points alone and a lost point names the exercise its
test is for. Each lab ends with one end-to-end test that runs all of your code together. The
course's own checks (documentation, site, notebooks, stub signatures, failure drills) are not run:
they are ``make test``'s, against the reference.

Graded over every lab, the report is focused on where you are: a lab with nothing written yet takes
one line (where to start), a lab you have started shows every exercise, and its "All together" row
says which exercises it still waits for. ``make hint EX=1.3`` (``minigpt/hints.py``) prints an
exercise's hints one at a time.

In a notebook: ``grade("1.1")`` prints the same report for one exercise and returns it.

A report saved with ``--save FILE`` can be shown again, exercise by exercise, without running anything:
with ``MINIGPT_GRADES=FILE`` set, ``grade()`` takes the results of the same implementation and folder
from it (the test suite grades each lab once and lets the notebooks' grade cells read it).

The report's words come from ``minigpt/exercises.toml`` (titles, and the stubs' task lines in
both languages) and from the tests' own messages (``tests/words.py``). Exit status: 0 when the
grading ran (whatever the score), 1 when it could not run, 2 for a bad option.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

from minigpt import cli, impl

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
CATALOG = Path(__file__).resolve().parent / "exercises.toml"
LANGS = ("en", "es")
LANG_VARIABLE = "MINIGPT_LANG"  # what the tests read (tests/words.py)
DETAILS_VARIABLE = "MINIGPT_DETAILS"  # make grade DETAILS=1: tracebacks of a crashed rank too
PREDICTIONS_TESTS = "tests/test_predictions.py"  # every lab's predictions, graded with its lab
SAVED_VARIABLE = "MINIGPT_GRADES"  # a report saved with --save: grade() shows its results instead of grading

WORDS = {
    "en": {
        "grading": "Grading {who} ({where})",
        "yours": "your code",
        "reference": "the reference",
        "exercise": "Exercise",
        "lab": "Lab",
        "prediction": "Prediction",
        "all": "All together",
        "all_title": "all of your code at once",
        "lost": "−{points} pt",
        "not_written": "not written yet: {task}",
        "not_written_short": "not written yet",
        "time_limit": "ran out of time (it did not fail): {what}; the limits are sized for a slow laptop: "
        "raise them with MINIGPT_TIME_SCALE=3 make grade",
        "did_not_run": "did not run",
        "full": "full marks",
        "total": "Total {earned}/{total} points · {seconds:.0f} s",
        "next": "One exercise: make grade EX={ex} · tracebacks: make grade EX={ex} DETAILS=1",
        "broken": "the grading could not run (pytest exit {code}); its output:",
        "not_graded": "not graded ({points} pt, not lost)",
        "not_graded_total": " · {points} pt not graded: run again, e.g. make grade EX={ex}",
        "untouched": "nothing written yet (start: make hint EX={ex} · make grade EX={ex})",
        "waits": "waits for Exercise {which} (not written yet)",
        "waits_many": "waits for Exercises {which} (not written yet)",
        "hint": "A hint: make hint EX={ex}",
        "why": "why",
    },
    "es": {
        "grading": "Corrigiendo {who} ({where})",
        "yours": "tu código",
        "reference": "la referencia",
        "exercise": "Ejercicio",
        "lab": "Laboratorio",
        "prediction": "Predicción",
        "all": "Todo junto",
        "all_title": "todo tu código a la vez",
        "lost": "−{points} pt",
        "not_written": "sin escribir todavía: {task}",
        "not_written_short": "sin escribir todavía",
        "time_limit": "se acabó el tiempo (no falló): {what}; los límites están pensados para un portátil lento: "
        "súbelos con MINIGPT_TIME_SCALE=3 make grade",
        "did_not_run": "no se ejecutó",
        "full": "nota completa",
        "total": "Total {earned}/{total} puntos · {seconds:.0f} s",
        "next": "Un ejercicio: make grade EX={ex} · trazas completas: make grade EX={ex} DETAILS=1",
        "broken": "la corrección no pudo ejecutarse (pytest salió con {code}); su salida:",
        "not_graded": "sin corregir ({points} pt, no perdidos)",
        "not_graded_total": " · {points} pt sin corregir: vuelve a ejecutarlo, p. ej. make grade EX={ex}",
        "untouched": "nada escrito todavía (para empezar: make hint EX={ex} · make grade EX={ex})",
        "waits": "espera al ejercicio {which} (sin escribir todavía)",
        "waits_many": "espera a los ejercicios {which} (sin escribir todavía)",
        "hint": "Una pista: make hint EX={ex}",
        "why": "por qué",
    },
}


@cache
def catalog() -> dict:
    with CATALOG.open("rb") as f:
        return tomllib.load(f)


def language(lang: str | None = None) -> str:
    """``lang``, else ``MINIGPT_LANG``, else ``LANG`` (``es_ES.UTF-8`` -> es); English by default."""
    for value in (lang, os.environ.get(LANG_VARIABLE), os.environ.get("LANG")):
        if value:
            return "es" if value.lower().startswith("es") else "en"
    return "en"


@dataclass
class Result:
    """One graded test's outcome, as conftest.py's ``--grade-report`` writes it."""

    name: str
    lab: str
    exercise: str
    points: int
    passed: bool
    kind: str
    reason: str


@dataclass
class Report:
    """What :func:`grade` found: every graded test's result, and the totals."""

    results: list[Result]
    seconds: float
    lang: str = "en"
    impl: str = "exercises"
    where: str = ""
    focus: bool = False  # every lab graded: a lab with nothing written yet takes one line
    text: str = field(default="", repr=False)

    @property
    def earned(self) -> int:
        return sum(r.points for r in self.results if r.passed)

    @property
    def total(self) -> int:
        """The points graded: a test that could not run because its ranks could not connect (a busy
        machine, :data:`NOT_GRADED`) is not graded, and its points are neither earned nor lost."""
        return sum(r.points for r in self.results if r.kind != NOT_GRADED)

    @property
    def not_graded(self) -> list[Result]:
        return [r for r in self.results if r.kind == NOT_GRADED]

    def __str__(self) -> str:
        return self.text


def task_line(reason: str, lang: str) -> str:
    """A stub's ``Exercise 1.3: ...`` message, in ``lang`` (the catalog's translation)."""
    number, _, task = reason.partition(": ")
    number = number.removeprefix("Exercise ").removeprefix("Prediction ").strip()
    word = WORDS[lang]["prediction" if number.startswith("P") else "exercise"]
    for entry in catalog()["exercises"].get(number, {}).get("tasks", []):
        if entry["en"] == task.strip():
            return f"{word} {number}: {entry[lang]}"
    return reason


def reason_line(result: Result, lang: str) -> str:
    words = WORDS[lang]
    if result.kind == "not written":
        return words["not_written"].format(task=task_line(result.reason, lang))
    if result.kind == "time limit":
        return words["time_limit"].format(what=result.reason)
    return result.reason or words["did_not_run"]


NOT_GRADED = "not graded"  # conftest.py's kind for a graded test whose ranks could not connect


def render(report: Report) -> str:
    """The report: per lab, per exercise, the points, and one line per lost point. When every lab is
    graded (``report.focus``), a lab with nothing written yet takes one line; the labs being worked
    on show every exercise. "All together" says which exercises it waits for."""
    lang, words, cat = report.lang, WORDS[report.lang], catalog()
    who = words["yours"] if report.impl == "exercises" else words["reference"]
    lines = [words["grading"].format(who=who, where=report.where), ""]
    order = list(cat["exercises"]) + ["all"]
    untouched = set()
    for lab in sorted({r.lab for r in report.results}):
        in_lab = [r for r in report.results if r.lab == lab]
        graded = [r for r in in_lab if r.kind != NOT_GRADED]  # its ranks could not connect: a busy machine
        earned, total = sum(r.points for r in graded if r.passed), sum(r.points for r in graded)
        heading = f"{words['lab']} {lab} · {cat['labs'][lab][lang]} · {earned}/{total}"
        exercises = sorted({r.exercise for r in in_lab}, key=order.index)
        if report.focus and all(r.kind == "not written" for r in in_lab):
            first = next(e for e in exercises if e != "all")
            lines.append(f"{heading} · {words['untouched'].format(ex=first)}")
            untouched.add(lab)
            continue
        if lines[-1]:
            lines.append("")
        lines.append(heading)
        # "All together" runs code, so it waits for exercises, never for a prediction's answer
        unwritten = [e for e in exercises if e != "all" and not e.startswith("P") and _not_written(in_lab, e)]
        for exercise in exercises:
            lines += _exercise_lines([r for r in in_lab if r.exercise == exercise], exercise, unwritten, lang)
        lines.append("")
    if lines[-1]:
        lines.append("")
    total = words["total"].format(earned=report.earned, total=report.total, seconds=report.seconds)
    if report.not_graded:
        first = report.not_graded[0].exercise
        total += words["not_graded_total"].format(points=sum(r.points for r in report.not_graded), ex=first)
    lines.append(total)
    started = [r for r in report.results if r.lab not in untouched] or report.results  # where the learner is
    first_lost = next(
        (r.exercise for r in started if not r.passed and r.exercise != "all" and r.kind != NOT_GRADED), None
    )
    if first_lost is not None:
        lines.append(words["next"].format(ex=first_lost))
        if _not_written(report.results, first_lost):
            lines.append(words["hint"].format(ex=first_lost))
    return "\n".join(lines)


def _not_written(results: list[Result], exercise: str) -> bool:
    """Is ``exercise`` still a stub (one of its tests stopped at its NotImplementedError)?"""
    return any(r.kind == "not written" for r in results if r.exercise == exercise)


def _exercise_lines(tests: list[Result], exercise: str, unwritten: list[str], lang: str) -> list[str]:
    """One exercise: its title and points, the task lines of a stub, one line per lost test."""
    words, cat = WORDS[lang], catalog()
    got = sum(r.points for r in tests if r.passed)
    out_of = sum(r.points for r in tests if r.kind != NOT_GRADED)
    if exercise == "all":
        title = f"{words['all']} · {words['all_title']}"
    else:
        kind = words["prediction" if exercise.startswith("P") else "exercise"]
        title = f"{kind} {exercise} · {cat['exercises'][exercise]['title'][lang]}"
    lines = [f"  {title} · {got}/{out_of}" + (f" · {words['full']}" if got == out_of else "")]
    waits = ""
    if exercise == "all" and unwritten:  # what it waits for, not another exercise's stub message
        waits = words["waits" if len(unwritten) == 1 else "waits_many"].format(which=", ".join(unwritten))
    else:
        tasks = dict.fromkeys(task_line(r.reason, lang) for r in tests if r.kind == "not written")
        lines += [f"    {words['not_written'].format(task=task)}" for task in tasks]  # once each
    for r in tests:
        if r.kind == NOT_GRADED:  # its reason says why after the words "not graded", already said here
            why = r.reason.removeprefix(f"{NOT_GRADED}: ")
            lines.append(f"    {words['not_graded'].format(points=r.points)} {r.name}: {why}")
        elif not r.passed:
            if r.kind == "not written":
                why = waits or words["not_written_short"]
            else:
                why = reason_line(r, lang)
            lines.append(f"    {words['lost'].format(points=r.points)} {r.name}: {why}")
    if exercise.startswith("P") and tests and all(r.kind in ("", "failed") for r in tests):
        from minigpt import predictions  # a prediction answered and graded: now its lesson

        lines.append(f"    {words['why']}: {predictions.QUESTIONS[exercise].why[lang]}")
    return lines


def _where(impl_name: str, env: Mapping[str, str] | None = None) -> str:
    if impl_name == "reference":
        return "minigpt/"
    if env is None:
        folder = impl.exercises_dir()
    else:
        folder = Path(env.get(impl.DIR_ENV_VAR) or impl.EXERCISES_DIR).expanduser().resolve()
    return f"{folder.relative_to(ROOT)}/" if folder.is_relative_to(ROOT) else f"{folder}/"


def grade(
    exercise: str | None = None,
    *,
    lab: str | None = None,
    impl: str | None = None,
    lang: str | None = None,
    details: bool = False,
) -> Report:
    """Grade one exercise (``"1.3"``, or ``"all"``: the end-to-end tests; several, comma-separated:
    ``"4.1,4.5"``, and ``"4.1,all"`` adds their labs' end-to-end tests), one lab (``"01"``) or
    everything, print the report and return it. ``impl`` is whose code (default: ``exercises``,
    yours); ``details`` shows pytest's own output, tracebacks included."""
    return _grade(exercise, lab, impl or "exercises", language(lang), details, True, os.environ)


def save(report: Report, path: str | Path) -> None:
    """Write ``report``'s results, for ``MINIGPT_GRADES`` to show them again."""
    rows = [{k: getattr(r, k) for k in Result.__dataclass_fields__} for r in report.results]
    data = {"impl": report.impl, "where": report.where, "seconds": report.seconds, "results": rows}
    Path(path).write_text(json.dumps(data, indent=1), encoding="utf-8")


def _saved(exercise: str | None, lab: str | None, impl_name: str, env: Mapping[str, str]) -> list[Result] | None:
    """The results ``MINIGPT_GRADES`` holds for this exercise or lab, graded with the same implementation
    from the same folder (None: grade for real)."""
    path = env.get(SAVED_VARIABLE)
    if not path or not Path(path).is_file():
        return None
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    if data["impl"] != impl_name or data["where"] != _where(impl_name, env):
        return None
    found = [
        Result(**row)
        for row in data["results"]
        if (exercise is None or row["exercise"] == exercise) and (lab is None or row["lab"] == lab)
    ]
    return found or None


def _grade(
    exercise: str | None,
    lab: str | None,
    impl_name: str,
    lang: str,
    details: bool,
    show: bool,
    environ: Mapping[str, str],
) -> Report:
    """:func:`grade` in the environment ``environ``, printing the report if ``show``."""
    labs = sorted(catalog()["labs"])
    environ = dict(environ)
    owners = labs
    if exercise is not None and exercise != "all":  # one exercise, or several ("1.2,4.3,all"): their labs' tests
        owners = sorted({impl.lab_of(one) for one in exercise.split(",") if one != "all"})
        lab = owners[0] if len(owners) == 1 else None
    saved = _saved(exercise, lab, impl_name, environ)
    if saved is not None:
        report = Report(saved, 0.0, lang, impl_name, _where(impl_name, environ))
        report.text = render(report)
        if show:
            print(report.text, flush=True)
        return report
    labs_graded = [lab] if lab else owners
    files = [f"tests/test_lab{one}.py" for one in labs_graded] + [PREDICTIONS_TESTS]
    env = {**environ, impl.ENV_VAR: impl_name, LANG_VARIABLE: lang, "PYTHONPATH": str(ROOT)}
    env.pop(impl.ONLY_ENV_VAR, None)
    if details:  # the graded tests add a crashed rank's own traceback to its line (tests/ranks.py)
        env[DETAILS_VARIABLE] = "1"
    with tempfile.TemporaryDirectory(prefix="grade-") as tmp:
        json_path = Path(tmp) / "grade.json"
        command = [sys.executable, "-m", "pytest", *files, f"--impl={impl_name}", f"--grade-report={json_path}"]
        command += ["-p", "no:cacheprovider", "--no-header"]
        command += ["-v", "--tb=short"] if details else ["-q", "--tb=no", "-rN"]
        if exercise is not None:
            command.append(f"--exercise={exercise}")
        command.append(f"--labs={','.join(labs_graded)}")  # the predictions' file holds every lab's
        start = time.perf_counter()
        proc = subprocess.run(command, cwd=ROOT, env=env, text=True, capture_output=not details)
        seconds = time.perf_counter() - start
        if proc.returncode not in (0, 1) or not json_path.exists():
            output = "" if details else (proc.stdout + proc.stderr)[-4000:]
            raise GradingError(f"{WORDS[lang]['broken'].format(code=proc.returncode)}\n{output}")
        data = json.loads(json_path.read_text())
    results = [Result(**{k: row[k] for k in Result.__dataclass_fields__}) for row in data["results"]]
    report = Report(
        results, seconds, lang, impl_name, _where(impl_name, environ), focus=exercise is None and lab is None
    )
    report.text = render(report)
    if show:
        print(report.text, flush=True)
    return report


class GradingError(RuntimeError):
    """The graded tests could not run (a collection error, pytest's own failure)."""


def main(argv: list[str] | None = None) -> int:
    exercises = [*catalog()["exercises"], "all"]
    parser = cli.ArgumentParser(
        prog="python -m minigpt.grader",
        description="Grade your exercises: per lab and per exercise, one line for each lost point.",
    )
    parser.add_argument("--exercise", choices=exercises, help="one exercise (e.g. 1.3), or all: end-to-end")
    parser.add_argument("--lab", choices=sorted(catalog()["labs"]), help="one lab (e.g. 01)")
    parser.add_argument("--impl", choices=impl.IMPLS, default="exercises", help="whose code (default: yours)")
    parser.add_argument("--lang", help="en or es (default: MINIGPT_LANG, then LANG, then en)")
    parser.add_argument("--details", action="store_true", help="pytest's own output too, tracebacks included")
    parser.add_argument("--save", metavar="FILE", help="also write the results here (MINIGPT_GRADES shows them again)")
    args = parser.parse_args(argv)
    if args.lang is not None and args.lang.strip().lower()[:2] not in LANGS:
        return cli.refuse(parser.name, f"--lang {args.lang}: choose en or es")
    if args.exercise not in (None, "all") and args.lab and impl.lab_of(args.exercise) != args.lab:
        return cli.refuse(parser.name, f"--exercise {args.exercise} is not in --lab {args.lab}")
    if args.save:
        try:
            cli.output_file(args.save, "--save")
        except ValueError as exc:
            return cli.refuse(parser.name, str(exc))
    try:
        report = grade(args.exercise, lab=args.lab, impl=args.impl, lang=args.lang, details=args.details)
        if args.save:
            save(report, args.save)
    except GradingError as exc:
        print(exc, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
