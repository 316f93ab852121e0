"""The grader's two whole runs, once per session (registered by ``conftest.py``): every lab graded with
the reference written into the exercise files (full marks) and with the untouched stubs (zero).

Both are proofs of the grader (tests/test_grader.py reads them) and both are saved
(``python -m minigpt.grader --save``): the notebooks' grade cells show these results exercise by
exercise (``MINIGPT_GRADES``, tests/test_notebooks.py) instead of grading each exercise again, so
every lab is graded once per implementation in the whole suite.

:func:`write_exercises` also writes the folders that grade the pitfalls one exercise at a time: the
stubs with each exercise's names taken from one mistake's file (``tests/pitfalls/rules/``), several
exercises' mistakes in one folder (tests/test_grader.py packs them).
"""

from __future__ import annotations

import functools
import importlib.util
from collections.abc import Mapping
from concurrent.futures import Future
from pathlib import Path
from types import ModuleType

import pytest

from minigpt import grader, impl, predictions
from tests import background, launcher
from tests.limits import limit

PITFALLS = Path(__file__).resolve().parent / "pitfalls"


def write_exercises(folder: Path, written: set[str], mistakes: dict[str, str] | None = None) -> Path:
    """The untouched stubs, copied into ``folder``, with the exercises in ``written`` done: each of
    their names (a function, or a method of the learner's class) set to the reference's; and each
    exercise of ``mistakes`` (exercise -> a file of tests/pitfalls/, no ``.py``: ``rules/<mistake>``)
    set to that file's names instead."""
    folder.mkdir(parents=True, exist_ok=True)
    mistakes = mistakes or {}
    for module in impl.REFERENCE:
        lines = [(impl.EXERCISES_DIR / f"{module}.py").read_text(), "", "from minigpt import impl as _impl", ""]
        if any(impl.EXERCISES[exercise][0] == module for exercise in mistakes):
            lines += ["from tests.grading import part as _part", ""]
        for exercise, (owner, names) in impl.EXERCISES.items():
            if owner != module or (exercise not in written and exercise not in mistakes):
                continue
            for name in names:
                cls, _, method = name.rpartition(".")
                if exercise in mistakes:
                    lines.append(f"{name} = _part({mistakes[exercise]!r}, {module!r}, {name!r})")
                elif cls:
                    lines.append(f"{cls}.{method} = vars(_impl.reference({module!r}, {cls!r}))[{method!r}]")
                else:
                    lines.append(f"{name} = _impl.reference({module!r}, {name!r})")
        (folder / f"{module}.py").write_text("\n".join(lines) + "\n")
    # a prediction done: the number the code measures, measured when the grading imports the file
    answers = predictions.stub_text().splitlines() + ["", "from minigpt.runners import predictions as _predictions", ""]
    answers += [
        f"{predictions.name_of(q)} = _predictions.measure({q!r})" for q in predictions.QUESTIONS if q in written
    ]
    (folder / "predictions.py").write_text("\n".join(answers) + "\n")
    return folder


def write_mistakes(mistakes: dict[str, str], folder: Path) -> Path:
    """The stubs with each exercise of ``mistakes`` taken from its file of tests/pitfalls/."""
    return write_exercises(folder, set(), mistakes)


@functools.cache
def mistake(name: str) -> ModuleType:
    """The module of tests/pitfalls/``name``.py (imported once per process)."""
    path = (PITFALLS / f"{name}.py").resolve()
    spec = importlib.util.spec_from_file_location(f"pitfall_{abs(hash(str(path)))}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def part(name: str, module: str, attribute: str):
    """Exercise module ``module``'s ``attribute`` (a function, or ``Class.method``) as the mistake in
    tests/pitfalls/``name``.py has it, or the reference's where that file leaves it alone."""
    cls, _, method = attribute.rpartition(".")
    if not cls:
        return getattr(mistake(name), attribute, None) or impl.reference(module, attribute)
    own = vars(getattr(mistake(name), cls, object))
    return own[method] if method in own else vars(impl.reference(module, cls))[method]


def grade_in(
    env: Mapping[str, str], exercise: str | None = None, lab: str | None = None, lang: str = "en", details: bool = False
) -> grader.Report:
    """The grader on the learner's path (``--impl exercises``) in the environment ``env``, printing nothing:
    the suite grades several folders at once, each in an environment of its own."""
    return grader._grade(exercise, lab, "exercises", grader.language(lang), details, False, env)


class Graded:
    """One whole grading: its report, the exercises folder it graded, and the saved results."""

    def __init__(self, folder: Path | None, saved: Path):
        env = {k: v for k, v in launcher.environ().items() if k not in (impl.DIR_ENV_VAR, grader.SAVED_VARIABLE)}
        env["OMP_NUM_THREADS"] = "1"  # one thread per process: it shares the cores with the rest of the suite
        if folder is not None:
            env[impl.DIR_ENV_VAR] = str(folder)
        self.report = grade_in(env)
        self.folder, self.saved = folder, saved
        grader.save(self.report, saved)


def reference_run(folder: Path) -> Graded:
    return Graded(write_exercises(folder / "exercises", set(impl.EXERCISES)), folder / "grades.json")


def stubs_run(folder: Path) -> Graded:
    return Graded(None, folder / "grades.json")


def submit(config: pytest.Config) -> dict[str, Future]:
    """Both whole gradings, on the suite's second lane (tests/background.py): each is a pytest process
    whose ranks often wait, so the other core works meanwhile."""
    lane = background.lane(config)
    return {
        "reference": lane.submit("reference graded", reference_run),
        "stubs": lane.submit("stubs graded", stubs_run),
    }


@pytest.fixture(scope="session")
def reference_graded(request) -> Graded:
    """Every lab, the reference written into the exercise files (``--impl exercises``)."""
    return submit(request.config)["reference"].result(timeout=limit(280))


@pytest.fixture(scope="session")
def stubs_graded(request) -> Graded:
    """Every lab, the untouched stubs of ``lab/exercises/``."""
    return submit(request.config)["stubs"].result(timeout=limit(280))
