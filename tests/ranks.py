"""The multi-process launches that the graded tests of Labs 01, 02, 04, 05 and 06 read, one per session each
(importing torch is the slow part of a rank), registered as fixtures by ``conftest.py``.

A launch runs only the scenarios the collected tests need: each scenario of a worker carries the
exercise it is for (``"1.3"``, ``"all"`` for the end-to-end one, ``"maintainer"`` for the course's
own checks), the fixture collects the tags of the tests that asked for it and passes them in
``MINIGPT_SCENARIOS``; the worker runs each scenario with ``MINIGPT_EXERCISE`` set to its tag, so
that only that exercise is the learner's. ``make grade EX=1.3`` starts two ranks and runs the few
scenarios of Exercise 1.3.

When a rank crashes or runs out of time before it reports a scenario, the test's reason is that
rank's own last error (gloo's or Python's), in one line, with the usual cause when it is a known one.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from minigpt import impl
from tests.launcher import ROOT, run_ranks
from tests.limits import NOT_GRADED, limit
from tests.words import say

SCENARIOS_VARIABLE = "MINIGPT_SCENARIOS"


@dataclass
class Launch:
    """What every rank of one launch reported: ``results[rank][scenario]``, and each rank's stderr."""

    results: list[dict]
    errors: list[str]


def wanted(session: pytest.Session, fixture: str) -> set[str]:
    """The tags of the collected tests that use ``fixture``: their exercise, or "maintainer"."""
    tags = set()
    for item in session.items:
        if fixture in getattr(item, "fixturenames", ()):
            marker = item.get_closest_marker("exercise")
            tags.add(str(marker.args[0]) if marker else "maintainer")
    return tags


def launch(request: pytest.FixtureRequest, worker: str, world: int, tags: set[str], timeout_s: float) -> Launch:
    impl_name = request.config.getoption("--impl")
    outdir = request.getfixturevalue("tmp_path_factory").mktemp(f"{worker}-{impl_name}")
    results, errors = run_ranks(
        ROOT / "tests" / f"{worker}.py",
        world,
        outdir,
        timeout_s=timeout_s,
        extra_env={impl.ENV_VAR: impl_name, SCENARIOS_VARIABLE: ",".join(sorted(tags))},
    )
    return Launch(results, errors)


@pytest.fixture(scope="session")
def ranks(request: pytest.FixtureRequest) -> Launch:
    """Lab 01's launch (tests/dist_worker.py): 4 ranks when a test needs the ring on 3 or 4 ranks
    or the course's own checks, else 2."""
    tags = wanted(request.session, "ranks")
    world = 4 if tags & {"1.1", "maintainer"} else 2
    return launch(request, "dist_worker", world, tags, limit(150))


@pytest.fixture(scope="session")
def zero1(request: pytest.FixtureRequest) -> Launch:
    """Lab 02's ZeRO-1 launch (tests/zero1_worker.py), on 3 ranks."""
    return launch(request, "zero1_worker", 3, wanted(request.session, "zero1"), limit(180))


@pytest.fixture(scope="session")
def fsdp_scratch(request: pytest.FixtureRequest) -> Launch:
    """Lab 04's launch (tests/fsdp_scratch_worker.py), on 2 ranks."""
    return launch(request, "fsdp_scratch_worker", 2, wanted(request.session, "fsdp_scratch"), limit(120))


@pytest.fixture(scope="session")
def tp_scratch(request: pytest.FixtureRequest) -> Launch:
    """Lab 05's launch (tests/tp_scratch_worker.py), on 2 ranks."""
    return launch(request, "tp_scratch_worker", 2, wanted(request.session, "tp_scratch"), limit(120))


@pytest.fixture(scope="session")
def pipeline_scratch(request: pytest.FixtureRequest) -> Launch:
    """Lab 06's launch (tests/pipeline_worker.py), on 3 ranks: three stages, so one in the middle."""
    return launch(request, "pipeline_worker", 3, wanted(request.session, "pipeline_scratch"), limit(150))


# the rank's last error -> the usual cause, in both languages
HINTS = (
    (
        r"doesn't match expected size|collective mismatch|Message truncated",
        "the ranks ran different collectives at the same moment: every rank must launch its buckets "
        "in the same order, bucket 0 first, not in the order the gradients arrive",
        "los ranks hicieron colectivas distintas a la vez: cada rank debe lanzar sus buckets en el "
        "mismo orden, el 0 primero, no en el orden en que llegan los gradientes",
    ),
    (
        r"[Tt]imed out|[Tt]imeout",
        "a rank waited for a collective its peer never started (a rank skipped a collective, or ran "
        "them in another order)",
        "un rank esperó una colectiva que su compañero nunca empezó (un rank se saltó una colectiva o "
        "las hizo en otro orden)",
    ),
    (
        r"'NoneType' object has no attribute 'wait'",
        "a bucket that was never launched has no handle to wait for: when a parameter got no gradient, "
        "raise a RuntimeError that names it",
        "un bucket que nunca se lanzó no tiene handle que esperar: si un parámetro no recibió gradiente, "
        "lanza un RuntimeError que lo nombre",
    ),
    (
        r"[Cc]onnection (closed|reset)|peer",
        "another rank crashed first: its error is the one to read",
        "otro rank falló antes: su error es el que hay que leer",
    ),
)


def last_error(stderr: str) -> str:
    """The last line of a rank's stderr that reads like an error, without gloo's source location
    (a C++ exception that ended the process: its ``what():`` line, the one that says why)."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    errors = [
        line
        for line in lines
        if re.search(r"Error|error:|Exception|what\(\)|terminate called|Aborted|killed at its time limit", line)
    ]
    line = (errors or lines or ["no output"])[-1]
    return clean(line)[:300]


def clean(error: str) -> str:
    """An error line without the source locations of gloo and PyTorch's C++ (``[enforce fail at
    pair.cc:456] op.preamble.length <= op.nbytes. 8 vs 4.``), which say nothing to a learner."""
    error = re.sub(r"^what\(\):\s*", "", error)
    error = re.sub(r"\[enforce fail at [^\]]*\]\s*(.*?\d+ vs \d+\.\s*)?", "", error)
    return re.sub(r"\[[^\]]*\.(?:cc|cpp|h):\d+\] ", "", error)


def explain(error: str) -> str:
    """An error line without gloo's source location, with the usual cause when it is a known one."""
    error = clean(error)
    for pattern, english, spanish in HINTS:
        if re.search(pattern, error):
            return f"{error} ({say('usual cause', 'causa habitual')}: {say(english, spanish)})"
    return error


def why_it_stopped(stderr: str) -> str:
    """A stopped rank's last error, explained."""
    return explain(last_error(stderr))


def where_in_yours(trace: str) -> str:
    """`` (in lab01_ddp.py, line 42, _launch)``: the last line of the learner's exercise files in a
    traceback, or nothing."""
    folder = str(impl.exercises_dir())
    frames = re.findall(r'File "([^"]+)", line (\d+), in (\S+)', trace)
    mine = [(Path(path).name, line, func) for path, line, func in frames if path.startswith(folder)]
    if not mine:
        return ""
    name, line, func = mine[-1]
    return say(f" (in {name}, line {line}, {func})", f" (en {name}, línea {line}, {func})")


def scenario(launch: Launch, name: str, rank: int) -> dict:
    """One rank's result of one scenario; a scenario that raised fails the test with its error (a
    stub's NotImplementedError keeps its "Exercise 1.x" message); a rank that crashed or ran out of
    time before it reported fails the test with the rank's own last error."""
    result = launch.results[rank].get(name) if rank < len(launch.results) else None
    if result is None:
        stopped = launch.errors[rank] if rank < len(launch.errors) else ""
        connect = re.search(r"could not connect to [^\n]*", stopped)
        if connect:  # a busy machine, not the code under test: not graded, no point lost
            pytest.skip(f"{NOT_GRADED}: rank {rank} {connect.group(0)}")
        raise AssertionError(
            say(
                f"rank {rank} stopped before it reported {name!r}: ",
                f"el rank {rank} se detuvo antes de informar de {name!r}: ",
            )
            + why_it_stopped(launch.errors[rank] if rank < len(launch.errors) else "")
        )
    if not result["ok"]:
        kind, _, message = result["error"].partition(": ")
        if kind == "NotImplementedError":
            raise NotImplementedError(message)
        raise AssertionError(
            f"rank {rank}, {name}: {explain(result['error'])}{where_in_yours(result.get('trace', ''))}"
        )
    return result
