"""The grading harness.

* ``--impl=reference|exercises`` picks whose code the graded tests run (default: reference, or
  the ``MINIGPT_IMPL`` environment variable). It is exported as ``MINIGPT_IMPL`` so that lab
  scripts started by a test run the same implementation.
* A graded test carries ``@pytest.mark.points(n)`` and ``@pytest.mark.exercise("1.3")`` (or
  ``exercise("all")``: the lab's end-to-end test, all of the learner's code together); its lab
  comes from ``@pytest.mark.lab("01")`` (usually set once per file with ``pytestmark``). Tests
  without points check the course's own machinery and are not scored.
* Each graded test runs with ``MINIGPT_EXERCISE`` set to its exercise: only that exercise is the
  learner's, the reference stands in for the others (see ``minigpt/impl.py``), so an exercise
  earns its points alone. ``--exercise 1.3`` keeps the graded tests of exercise 1.3 only
  (``--exercise 4.1,4.5``: those of both).
* A session that grades the reference whole (a selected test reads ``reference_graded``, as
  ``make test`` does) leaves the graded tests to that grading (tests/grading.py, on the second lane),
  which runs every one of them with the reference written into the exercise files, and ends with its
  score table: each graded test runs once per implementation in the whole suite.
* ``--grade-report FILE`` writes every graded test's result as JSON (what ``python -m
  minigpt.grader``, ``make grade``, reads). At the end of every run a score table is printed,
  one line per lab, e.g. ``Lab 00 · MiniGPT and the baseline · 12/12``, followed by a short
  reason for each lost point.
"""

from __future__ import annotations

import importlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest

from minigpt import grader, impl as impl_switch
from tests import background, limits
from tests.limits import NOT_GRADED, limit
from tests.words import say

pytest_plugins = [
    "tests.ranks",  # the launches of Labs 01, 02, 04, 05, 06 (ranks, zero1, fsdp_scratch, tp_scratch, pipeline_scratch)
    "tests.grading",  # the grader's two whole runs (reference_graded, stubs_graded)
]

LAB_TITLES = {lab: titles["en"] for lab, titles in grader.catalog()["labs"].items()}  # minigpt/exercises.toml


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--impl",
        choices=impl_switch.IMPLS,
        default=os.environ.get(impl_switch.ENV_VAR) or "reference",
        help="whose implementation the graded tests run: the reference in minigpt/ "
        "or yours in lab/exercises/ (default: reference)",
    )
    parser.addoption(
        "--exercise",
        default=None,
        help="run only the graded tests of this exercise (e.g. 1.3, or all: the end-to-end tests), or of "
        "several, comma-separated (e.g. 4.1,4.5: each test still has only its own exercise the learner's)",
    )
    parser.addoption(
        "--labs",
        default=None,
        help="keep only the graded tests of these labs (e.g. 01,04), and every test without points: the grader "
        "runs each lab's file and tests/test_predictions.py, which holds every lab's predictions",
    )
    parser.addoption("--grade-report", default=None, help="write the graded tests' results to this JSON file")


# The contributor's quick loop (make test-fast, pytest -m "not slow") leaves out every test that starts
# processes or trains a model: the modules below, and any test that uses a session launch. What is
# left is the unit tests of the package and the page tests. (CONTRIBUTING: "The suite's time".)
SLOW_MODULES = {
    "test_bad_input",  # a few rows under a real torchrun
    "test_checkpoints",
    "test_kernel_sets",
    "test_lab01",
    "test_lab01_links",
    "test_lab01_reference",
    "test_lab01_script",
    "test_lab02_crosscheck",
    "test_lab03_options",
    "test_lab03_practice",
    "test_lab03_run",
    "test_lab04_reference",
    "test_lab05_scripts",
    "test_lab06_mesh_script",
    "test_lab06_pipeline_script",
    "test_notebooks",
    "test_platforms",
    "test_proof",
    "test_site",
    "test_train",
    "test_grader",
    "test_launcher",
}
SLOW_FIXTURES = {
    "ranks",
    "zero1",
    "fsdp_scratch",
    "tp_scratch",
    "pipeline_scratch",
    "more_ranks",
    "default_run",
    *background.LAUNCHES,
}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark the slow tests; keep one exercise's graded tests when ``--exercise`` asks for it; scale
    every test's time limit (its ``timeout`` marker, or the ini's) by MINIGPT_TIME_SCALE."""
    for item in items:
        module = item.module.__name__.rpartition(".")[2] if item.module else ""
        if module in SLOW_MODULES or SLOW_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)
    # the tests that read the second lane's runs last (tests/background.py: their runs go on meanwhile),
    # and after them a test that times something, once the lane is quiet
    lane = [item for item in items if background.FIXTURES & set(getattr(item, "fixturenames", ()))]
    # the README's default run trains in the background from collection on (start_default_run): its
    # readers go late too, with the lane's, so that no test waits for it while others could run
    lane = [item for item in items if "default_run" in getattr(item, "fixturenames", ()) and item not in lane] + lane
    if lane:
        last = {id(item) for item in lane}
        items[:] = [item for item in items if id(item) not in last] + lane
    labs = config.getoption("--labs")
    if labs is not None:
        keep_labs = {lab.strip() for lab in labs.split(",")}
        other = [item for item in items if (m := item.get_closest_marker("lab")) and str(m.args[0]) not in keep_labs]
        config.hook.pytest_deselected(items=other)
        items[:] = [item for item in items if item not in other]
    wanted = config.getoption("--exercise")
    if wanted is not None:
        names = selected_exercises(wanted)
        keep = [item for item in items if exercise_of(item) in names]
        config.hook.pytest_deselected(items=[item for item in items if exercise_of(item) not in names])
        items[:] = keep
    factor = limits.scale()
    if factor == 1:
        return
    default = float(config.getini("timeout") or 0)
    for item in items:
        marker = item.get_closest_marker("timeout")
        seconds = float(marker.args[0]) if marker and marker.args else default
        if seconds:
            item.add_marker(pytest.mark.timeout(seconds * factor), append=False)


def pytest_configure(config: pytest.Config) -> None:
    os.environ[impl_switch.ENV_VAR] = config.getoption("--impl")
    # One thread per process, this one too (unless OMP_NUM_THREADS says otherwise): the suite's second lane
    # keeps the other core busy, and two threads of this process spin-waiting for each other on a busy
    # core are slower than one (under load, the resume test takes about twice as long on two threads as on
    # one). The processes started from here inherit it.
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch

    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    config.addinivalue_line("markers", "points(n): a graded test worth n points")
    config.addinivalue_line("markers", "lab(id): the lab a graded test belongs to, e.g. '00'")
    config.addinivalue_line("markers", "exercise(n): the exercise a graded test is for, e.g. '1.3', or 'all'")
    config.addinivalue_line("markers", "slow: starts processes or trains a model (make test-fast leaves it out)")
    config.stash[_SCORES] = {}
    if not config.pluginmanager.has_plugin("minigpt-graded-on-the-lane"):
        config.pluginmanager.register(_GradedOnTheLane(), "minigpt-graded-on-the-lane")
    config.stash[_SKIPPED] = []


@dataclass
class _Result:
    lab: str
    points: int
    name: str
    exercise: str
    passed: bool = True
    reason: str = ""
    kind: str = ""  # why it failed: "not written", "time limit", "failed"
    seen: set = field(default_factory=set)


_SCORES = pytest.StashKey[dict]()
_GRADED_ON_LANE = pytest.StashKey[int]()  # how many graded tests the reference grading runs instead
_SKIPPED = pytest.StashKey[list]()  # (test id, reason) of every test that did not run


def _points_and_lab(item: pytest.Item) -> tuple[int, str] | None:
    points = item.get_closest_marker("points")
    if points is None:
        return None
    lab = item.get_closest_marker("lab")
    if lab is None:
        raise pytest.UsageError(f"{item.nodeid} has points but no @pytest.mark.lab")
    if exercise_of(item) is None:
        raise pytest.UsageError(f"{item.nodeid} has points but no @pytest.mark.exercise")
    return int(points.args[0]), str(lab.args[0])


def exercise_of(item: pytest.Item) -> str | None:
    """The exercise a graded test is for ("1.3", or "all"), None for a test without one."""
    marker = item.get_closest_marker("exercise")
    return None if marker is None else str(marker.args[0])


@pytest.fixture(autouse=True)
def _only_this_exercise(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """A graded test of exercise X runs with only X the learner's (``MINIGPT_EXERCISE``), the
    reference standing in for the others; an end-to-end test (``all``) runs all of the learner's.
    Tests without an exercise run with the variable unset."""
    monkeypatch.setenv(impl_switch.ONLY_ENV_VAR, exercise_of(request.node) or "all")


def _ran_out_of_time(call: pytest.CallInfo) -> bool:
    """Did a time limit end this test (pytest-timeout's, a subprocess's, or tests/launcher's)?"""
    exc = call.excinfo
    if exc is None:
        return False
    text = exc.exconly()
    return exc.errisinstance(subprocess.TimeoutExpired) or "Timeout (>" in text or "killed at its time limit" in text


def _reason(call: pytest.CallInfo) -> tuple[str, str]:
    """(kind, one line) for a failed test: the stub's task line, a time limit that ran out, or the
    first line of the assertion (what was expected and what came)."""
    exc = call.excinfo
    if exc is None:
        return "", ""
    if exc.errisinstance(NotImplementedError):
        return "not written", str(exc.value) or "not implemented"
    if _ran_out_of_time(call):
        return "time limit", exc.exconly().strip().splitlines()[0][:200]
    if exc.errisinstance(SyntaxError):  # the learner's file does not parse: where, and why
        err = exc.value
        return "failed", say(
            f"{type(err).__name__} in {err.filename}, line {err.lineno}: {err.msg}",
            f"{type(err).__name__} en {err.filename}, línea {err.lineno}: {err.msg}",
        )
    text = exc.exconly().strip().splitlines()
    first = (text[0] if text else exc.typename).removeprefix("AssertionError: ")
    if not exc.errisinstance(AssertionError):  # an error raised in the learner's code: why, and where
        from tests.ranks import likely_cause  # a plugin of this conftest: imported once pytest rewrites it

        cause = likely_cause(first)
        folder = impl_switch.exercises_dir()
        mine = [e for e in exc.traceback if Path(str(e.path)).resolve().is_relative_to(folder)]
        if mine:
            name, line, func = Path(str(mine[-1].path)).name, mine[-1].lineno + 1, mine[-1].name
            first += say(f" (in {name}, line {line}, {func})", f" (en {name}, línea {line}, {func})")
        first += cause
    if first.startswith("assert ") and exc.errisinstance(AssertionError):
        first = f"a check failed: {first}"  # an assert without a message: pytest's rewrite of it
    return "failed", first if len(first) <= 700 else first[:697] + "..."


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    outcome = yield
    report = outcome.get_result()
    if report.failed and _ran_out_of_time(call):
        report.sections.append(("time limit", limits.HINT))
    if report.skipped:
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        item.config.stash[_SKIPPED].append((item.nodeid, reason.removeprefix("Skipped: ")))
    graded = _points_and_lab(item)
    if graded is None:
        return
    scores = item.config.stash[_SCORES]
    result = scores.setdefault(item.nodeid, _Result(graded[1], graded[0], item.name, exercise_of(item)))
    result.seen.add(report.when)
    if report.failed or report.skipped:
        if result.passed:  # keep the first reason
            result.kind, result.reason = ("skipped", "skipped") if report.skipped else _reason(call)
            if report.skipped:
                reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
                reason = reason.removeprefix("Skipped: ")
                if reason.startswith(NOT_GRADED):  # its ranks could not connect: a busy machine
                    result.kind, result.reason = NOT_GRADED, reason
        result.passed = False


@pytest.fixture
def impl_name(request: pytest.FixtureRequest) -> str:
    return request.config.getoption("--impl")


class _Exercises:
    """Attribute access to one exercise module's functions, reference or the learner's."""

    def __init__(self, module: str, impl: str):
        self._module, self._impl = module, impl

    def __getattr__(self, name: str):
        return impl_switch.load(self._module, name, self._impl)


def _functions_under_test(name: str, module: str):
    def fixture(impl_name: str) -> _Exercises:
        return _Exercises(module, impl_name)

    fixture.__doc__ = f"The functions of {module}.py under test (the reference's or the learner's)."
    return pytest.fixture(name=name)(fixture)


# lab00 ... lab07 (and lab06_mesh): each exercise module's functions, as the graded tests call them
for _name, _module in {
    "lab00": "lab00_baseline",
    "lab02": "lab02_zero",
    "lab03": "lab03_fsdp",
    "lab04": "lab04_fsdp",
    "lab05": "lab05_tensor_parallel",
    "lab06": "lab06_pipeline",
    "lab06_mesh": "lab06_mesh",
    "lab07": "lab07_nd_parallel",
}.items():
    globals()[f"_{_name}_fixture"] = _functions_under_test(_name, _module)


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_terminal_summary(terminalreporter, exitstatus, config: pytest.Config):
    yield  # the outermost wrapper: the table comes after pytest's own summary, last on screen
    scores: dict[str, _Result] = config.stash.get(_SCORES, {})
    if config.getoption("--grade-report"):
        _write_grade_report(config, scores)
    if scores:
        impl = config.getoption("--impl")
        where = "minigpt/"
        if impl == "exercises":
            folder = impl_switch.exercises_dir()
            where = (
                str(folder.relative_to(config.rootpath)) + "/"
                if folder.is_relative_to(config.rootpath)
                else str(folder)
            )
        # a test that never reached its call phase (setup error) has not passed
        results = [replace(r, passed=r.passed and "call" in r.seen) for r in scores.values()]
        _score_table(terminalreporter, f"score ({impl} implementation, {where})", results)
    elif _GRADED_ON_LANE in config.stash and not config.option.collectonly:
        _lane_score_table(terminalreporter, config)
    # a test that did not run proves nothing: say so where the eye lands last, not only in pytest's list
    for nodeid, reason in config.stash.get(_SKIPPED, []):
        terminalreporter.write_line(f"NOT RUN: {nodeid}: {reason}", red=True, bold=True)


def selected_exercises(wanted: str) -> set[str]:
    """The exercises ``--exercise`` names (one, or several comma-separated), or a usage error that
    names the ones that do not exist."""
    names = {name.strip() for name in wanted.split(",")}
    unknown = sorted(names - {*impl_switch.EXERCISES, "all"})
    if unknown:
        raise pytest.UsageError(
            f"--exercise {wanted!r}: {', '.join(map(repr, unknown))} is not an exercise; choose one of "
            f"{', '.join(impl_switch.EXERCISES)} or all (several: comma-separated)"
        )
    return names


class _GradedOnTheLane:
    """Runs after pytest's own ``-k`` / ``-m`` selection (``trylast``), on what is left."""

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, config: pytest.Config, items: list[pytest.Item]) -> None:
        if not graded_on_the_lane(config, items):
            return
        # every graded test runs once per implementation in the whole suite: this session grades the
        # reference written into the exercise files (tests/grading.py, on the second lane), which runs
        # each of them; the score table at the end is that grading's
        graded = [item for item in items if item.get_closest_marker("points") is not None]
        config.stash[_GRADED_ON_LANE] = len(graded)
        config.hook.pytest_deselected(items=graded)
        items[:] = [item for item in items if item.get_closest_marker("points") is None]


def graded_on_the_lane(config: pytest.Config, items: list[pytest.Item]) -> bool:
    """Does the reference grading (tests/grading.py) run every graded test in this session? It does
    when a selected test reads it and this session grades the reference itself, whole: then the
    graded tests are left to it instead of running twice."""
    return (
        config.getoption("--impl") == "reference"
        and config.getoption("--exercise") is None
        and not config.getoption("--grade-report")
        and any("reference_graded" in getattr(item, "fixturenames", ()) for item in items)
    )


def _lane_score_table(terminalreporter, config: pytest.Config) -> None:
    """The score table of the reference grading, which ran this session's graded tests."""
    lane = config.stash.get(background.KEY, None)
    future = None if lane is None else lane.futures.get("reference graded")
    if future is None or not future.done() or future.exception() is not None:
        terminalreporter.write_line(
            f"NOT RUN: the {config.stash[_GRADED_ON_LANE]} graded tests: the reference grading "
            "(tests/grading.py) did not finish",
            red=True,
            bold=True,
        )
        return
    title = "score (reference implementation, written into lab/exercises/: tests/grading.py)"
    _score_table(terminalreporter, title, future.result().report.results)


def _score_table(terminalreporter, title: str, results: list) -> None:
    """One line per lab, then one per point not earned. A test whose ranks could not connect (a busy
    machine) is not graded: its points are neither earned nor lost."""
    terminalreporter.write_sep("=", title)
    for lab in sorted({r.lab for r in results}):
        in_lab = [r for r in results if r.lab == lab]
        earned = sum(r.points for r in in_lab if r.passed)
        total = sum(r.points for r in in_lab if r.kind != NOT_GRADED)
        terminalreporter.write_line(f"Lab {lab} · {LAB_TITLES.get(lab, '')} · {earned}/{total}")
        for r in in_lab:
            if r.kind == NOT_GRADED:
                terminalreporter.write_line(f"    not graded, {r.points} pt: {r.name}: {r.reason}")
            elif not r.passed:
                reason = r.reason or "did not run"
                if r.kind == "time limit":
                    reason = f"ran out of time, it did not fail: {reason} ({limits.HINT})"
                terminalreporter.write_line(f"    lost {r.points} pt: {r.name}: {reason}")


def _write_grade_report(config: pytest.Config, scores: dict[str, _Result]) -> None:
    """Every graded test's result, for the grader's report (``python -m minigpt.grader``)."""
    rows = [
        {
            "nodeid": nodeid,
            "name": r.name,
            "lab": r.lab,
            "exercise": r.exercise,
            "points": r.points,
            "passed": r.passed and "call" in r.seen,
            "kind": r.kind or ("" if r.passed and "call" in r.seen else "did not run"),
            "reason": r.reason,
        }
        for nodeid, r in scores.items()
    ]
    path = config.getoption("--grade-report")
    with open(path, "w", encoding="utf-8") as f:
        json.dump({"impl": config.getoption("--impl"), "results": rows}, f, indent=1)


DEFAULT_RUN = pytest.StashKey[dict]()


def pytest_collection_finish(session: pytest.Session) -> None:
    """Start the background work the selected tests will read: the README's default run, and the
    second lane's runs (tests/background.py), the whole gradings first (the notebooks wait for them)."""
    if session.config.option.collectonly:
        return
    used = set().union(*(getattr(item, "fixturenames", ()) for item in session.items))
    if "default_run" in used:
        start_default_run(session.config)
    if used & {"reference_graded", "stubs_graded", "executed"}:
        from tests import grading  # a plugin (pytest_plugins): imported once pytest has rewritten it

        grading.submit(session.config)
    if "graded" in used:
        from tests import test_grader

        test_grader.submit(session.config)
    if "executed" in used:
        from tests import test_notebooks

        test_notebooks.submit(session.config)
    for fixture, where in background.LAUNCHES.items():  # two ranks each, beside the first lane's last files
        if fixture in used:
            module, function = where.split(":")
            getattr(importlib.import_module(module), function)(session.config)


def start_default_run(config: pytest.Config) -> None:
    """Start the README's default run in the background as soon as the tests are collected, when one of
    them reads it: it trains on one thread, so the suite's other core does it while the first tests
    run (about a minute saved on two cores), and ``default_run`` waits for it where it is first used."""
    if config.option.collectonly or DEFAULT_RUN in config.stash:
        return
    folder = Path(tempfile.mkdtemp(prefix="minigpt-default-run-"))
    out = open(folder / "stdout.txt", "w", encoding="utf-8")  # a file, not a pipe: nobody reads it meanwhile
    err = open(folder / "stderr.txt", "w", encoding="utf-8")
    proc = subprocess.Popen(
        [sys.executable, "-m", "minigpt.train", "--quiet", "--out", str(folder / "minigpt.pt")],
        stdout=out,
        stderr=err,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    config.stash[DEFAULT_RUN] = {"proc": proc, "folder": folder, "files": (out, err), "started": time.monotonic()}


def pytest_unconfigure(config: pytest.Config) -> None:
    background.close(config)
    run = config.stash.get(DEFAULT_RUN, None)
    if run is not None:
        if run["proc"].poll() is None:
            run["proc"].kill()
            run["proc"].wait()
        for f in run["files"]:
            f.close()
        shutil.rmtree(run["folder"], ignore_errors=True)


@pytest.fixture(scope="session")
def default_run(request):
    """``python -m minigpt.train`` with every default (the README's single-process run), trained once
    per session, on one thread: two threads that spin-wait for each other on a busy two-core machine
    can take ten times as long, and the tests read only its accuracy and loss, not its last bits.
    Started in the background when the tests are collected (``start_default_run``); here its end is
    waited for, within the fixture's limit (240 s, scaled by tests/limits.py) counted from its start.
    Returns the checkpoint path, the output, and the numbers of its final line."""
    start_default_run(request.config)  # already started, unless collection did not see a test that reads it
    run = request.config.stash[DEFAULT_RUN]
    left = limit(240) - (time.monotonic() - run["started"])
    try:
        returncode = run["proc"].wait(timeout=max(left, 1))
    except subprocess.TimeoutExpired:
        pytest.fail(f"python -m minigpt.train did not finish within {limit(240):.0f} s; {limits.HINT}")
    for f in run["files"]:
        f.flush()
    stdout = (run["folder"] / "stdout.txt").read_text(encoding="utf-8")
    stderr = (run["folder"] / "stderr.txt").read_text(encoding="utf-8")
    out = run["folder"] / "minigpt.pt"
    proc = subprocess.CompletedProcess(run["proc"].args, returncode, stdout, stderr)
    assert proc.returncode == 0, proc.stderr
    final = re.search(
        r"final: step (\d+) \| val loss ([\d.]+) \| tutor accuracy ([\d.]+)% "
        r"\((\d+)/(\d+) held-out test sentences, exact match\) \| ([\d.]+) s",
        proc.stdout,
    )
    assert final, proc.stdout
    return {
        "checkpoint": out,
        "stdout": proc.stdout,
        "steps": int(final.group(1)),
        "val_loss": float(final.group(2)),
        "correct": int(final.group(4)),
        "total": int(final.group(5)),
        "seconds": float(final.group(6)),
    }
