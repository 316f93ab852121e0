"""The multi-process launches that the graded tests of Labs 01, 02, 04, 05 and 06 read, one per session each
(importing torch is the slow part of a rank), registered as fixtures by ``conftest.py``.

A launch runs only the scenarios the collected tests need: each scenario of a worker carries the
exercise it is for (``"1.3"``, ``"all"`` for the end-to-end one, ``"maintainer"`` for the course's
own checks), the fixture collects the tags of the tests that asked for it and passes them in
``MINIGPT_SCENARIOS``; the worker runs each scenario with ``MINIGPT_EXERCISE`` set to its tag, so
that only that exercise is the learner's. ``make grade EX=1.3`` starts two ranks and runs the few
scenarios of Exercise 1.3.

When a rank crashes or runs out of time before it reports a scenario, the test's reason is that
rank's own last error (gloo's or Python's), in one line, with the likely cause when it is a known one;
when that error only says that another rank went away first ("connection closed by peer") or never
came (a time-out), the other rank's own error and the learner's line come first, this one as its
consequence, or the report says which rank waited for which.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from minigpt import grader, impl
from tests.launcher import ROOT, run_ranks
from tests.limits import NOT_GRADED, limit
from tests.words import say

SCENARIOS_VARIABLE = "MINIGPT_SCENARIOS"
# an error that only says another rank went away first, and one that says a rank waited for another
PEER_CLOSED = r"[Cc]onnection (closed|reset)|[Bb]roken pipe|by peer"
TIMED_OUT = r"[Tt]imed out|[Tt]imeout"


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
    """Lab 05's launch (tests/tp_scratch_worker.py): 4 ranks, two tensor-parallel groups of 2, when a
    test of Exercise 5.2 needs it (f and g must talk on their own group, not the whole world), else
    one group of 2."""
    tags = wanted(request.session, "tp_scratch")
    world = 4 if "5.2" in tags else 2
    return launch(request, "tp_scratch_worker", world, tags, limit(120))


@pytest.fixture(scope="session")
def pipeline_scratch(request: pytest.FixtureRequest) -> Launch:
    """Lab 06's launch (tests/pipeline_worker.py), on 3 ranks: three stages, so one in the middle."""
    return launch(request, "pipeline_worker", 3, wanted(request.session, "pipeline_scratch"), limit(150))


# the rank's last error -> its likely cause, in both languages
HINTS = (
    (
        r"doesn't match expected size|collective mismatch|Message truncated",
        "the ranks ran different collectives at the same moment, or the same one with different sizes: in "
        "DDP every rank must launch its buckets in the same order, bucket 0 first, not in the order the "
        "gradients arrive; in FSDP every rank's shard of a parameter must have the same shape",
        "los ranks hicieron colectivas distintas a la vez, o la misma con tamaños distintos: en DDP cada rank "
        "debe lanzar sus buckets en el mismo orden, el 0 primero, no en el orden en que llegan los gradientes; "
        "en FSDP el fragmento de un parámetro debe tener la misma forma en todos los ranks",
    ),
    (
        r"storage of size 0|setStorage.*size 0",
        "a unit's parameters were used while freed (their storage is 0 bytes): gathered too late or freed too "
        "early; a unit must be whole from its pre-forward to its post-forward and again from its pre-backward "
        "to its post-backward",
        "se usaron los parámetros de una unidad mientras estaban liberados (su almacenamiento tiene 0 bytes): "
        "se reunieron demasiado tarde o se liberaron demasiado pronto; una unidad debe estar entera desde su "
        "pre-forward hasta su post-forward, y otra vez desde su pre-backward hasta su post-backward",
    ),
    (
        r"never run backward",
        "a micro-batch still held at the end of the step: its B never ran, or backward_step read held[i] "
        "without taking it out (held.pop(i)), so the stage keeps its activations",
        "un microlote sigue guardado al final del paso: su B nunca se ejecutó, o backward_step leyó held[i] "
        "sin sacarlo (held.pop(i)), así que la etapa conserva sus activaciones",
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
        PEER_CLOSED,
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


def likely_cause(error: str) -> str:
    """`` (likely cause: ...)`` for an error line of a known symptom, in the learner's language, or nothing."""
    for pattern, english, spanish in HINTS:
        if re.search(pattern, error):
            return f" ({say('likely cause', 'causa probable')}: {say(english, spanish)})"
    return ""


def explain(error: str) -> str:
    """An error line without gloo's source location, with its likely cause when it is a known one."""
    error = clean(error)
    return error + likely_cause(error)


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


# ----------------------------------------------------------------------------------------------
# which rank's error is the cause, and which ones are its consequences


@dataclass
class Outcome:
    """One rank's outcome of one scenario: ``ok``, ``raised`` (the scenario's own error, recorded)
    or ``stopped`` (the rank ended before it reported the scenario; ``error`` is its last error)."""

    rank: int
    state: str
    error: str = ""
    where: str = ""  # the learner's file and line, when the traceback passes through it
    trace: str = ""  # the traceback (or the end of the stopped rank's stderr): shown with make grade DETAILS=1

    @property
    def kind(self) -> str:
        """``stub`` (a NotImplementedError), ``peer`` (it only saw another rank close the connection),
        ``timeout`` (it waited for another rank), or ``cause`` (an error of its own)."""
        if self.state == "ok":
            return "ok"
        if self.error.startswith("NotImplementedError"):
            return "stub"
        if re.search(PEER_CLOSED, self.error):
            return "peer"
        if re.search(TIMED_OUT, self.error) and "PipelineTimeout" not in self.error:
            return "timeout"
        return "cause"


def outcome(launch: Launch, name: str, rank: int) -> Outcome:
    result = launch.results[rank].get(name) if rank < len(launch.results) else None
    if result is None:
        stderr = launch.errors[rank] if rank < len(launch.errors) else ""
        return Outcome(rank, "stopped", last_error(stderr), where_in_yours(stderr), stderr[-3000:])
    if result["ok"]:
        return Outcome(rank, "ok")
    trace = result.get("trace", "")
    return Outcome(rank, "raised", clean(result["error"]), where_in_yours(trace), trace)


DETAILS_VARIABLE = grader.DETAILS_VARIABLE  # make grade DETAILS=1 (minigpt.grader --details)


def order(launch: Launch) -> list[str]:
    """The scenarios in the order the launch ran them (a worker runs them in one order on every rank;
    a rank that stopped reported only the first ones)."""
    return max((list(r) for r in launch.results), key=len, default=[])


def stopped_in(launch: Launch, rank: int) -> str | None:
    """The scenario ``rank`` was running when its process ended (the first it did not report), or None."""
    reported = launch.results[rank] if rank < len(launch.results) else {}
    return next((n for n in order(launch) if n not in reported and n != "finished"), None)


def earlier_cause(launch: Launch, name: str) -> tuple[str, Outcome] | None:
    """The first rank's own error (not a stub, not a consequence) in a scenario that ran before ``name``: a
    rank that stopped there, or raised there. The ranks' collectives are out of step from that moment on,
    so what fails after it with no error of its own is that error's consequence, not the code it grades."""
    names = order(launch)
    before = names[: names.index(name)] if name in names else names
    for earlier in before:
        for rank in range(len(launch.results)):
            o = outcome(launch, earlier, rank)
            if o.kind == "cause":
                return earlier, o
    return None


def described(o: Outcome, name: str) -> str:
    """One rank's error as the report shows it: the rank, the error, its likely cause, the learner's line."""
    if o.state == "stopped":
        head = say(
            f"rank {o.rank} stopped before it reported {name!r}: ",
            f"el rank {o.rank} se detuvo antes de informar de {name!r}: ",
        )
    else:
        head = f"rank {o.rank}, {name}: "
    details = f"\n{o.trace.rstrip()}" if os.environ.get(DETAILS_VARIABLE) and o.trace else ""
    return head + o.error + o.where + likely_cause(o.error) + details


def waited(o: Outcome, others: list[Outcome], name: str) -> str:
    """A rank that timed out, when no rank raised an error of its own: which rank waited for which."""
    seconds = re.search(r"(\d+)\s*ms", o.error)
    how_long = f" {int(seconds.group(1)) / 1000:g} s" if seconds else ""
    finished = [p.rank for p in others if p.state == "ok"]
    elsewhere = "".join(
        f"; rank {p.rank}{p.where or say(' (not in your code)', ' (fuera de tu código)')}" for p in others
    )
    if finished:
        ranks = ", ".join(map(str, finished))
        cause = say(
            f"rank {o.rank} waited{how_long} in a collective for rank {ranks}, which finished {name!r} without "
            "starting it: a rank skipped a collective (or ran fewer of them)",
            f"el rank {o.rank} esperó{how_long} en una colectiva al rank {ranks}, que terminó {name!r} sin "
            "empezarla: un rank se saltó una colectiva (o hizo menos)",
        )
    else:
        ranks = ", ".join(str(p.rank) for p in others) or "?"
        cause = say(
            f"rank {o.rank} waited{how_long} in a collective for rank {ranks}, which was waiting too: the ranks "
            "called different collectives, or the same ones in another order",
            f"el rank {o.rank} esperó{how_long} en una colectiva al rank {ranks}, que también esperaba: los ranks "
            "llamaron a colectivas distintas, o a las mismas en otro orden",
        )
    where = say("where each rank was", "dónde estaba cada rank") + f": rank {o.rank}{o.where}{elsewhere}"
    return f"rank {o.rank}, {name}: {o.error}{o.where} ({say('likely cause', 'causa probable')}: {cause}; {where})"


def diagnose(launch: Launch, name: str, rank: int) -> str:
    """Why ``rank`` has no result for scenario ``name``, cause first: when another rank's own error
    (a Python exception in the learner's code, a gloo mismatch, a crash) made this rank's collective
    fail ("connection closed by peer", a time-out), that error and the learner's line come first,
    and this rank's error follows as its consequence."""
    outcomes = [outcome(launch, name, r) for r in range(max(len(launch.results), rank + 1))]
    mine = outcomes[rank]
    others = [o for o in outcomes if o.rank != rank]
    if mine.kind == "cause":
        return described(mine, name)
    causes = [o for o in others if o.kind == "cause"]
    if causes:
        first = min(causes, key=lambda o: (not o.where, o.rank))  # one with the learner's line first
        return described(first, name) + say(
            f"; rank {rank}: {mine.error} (a consequence: rank {first.rank} stopped first)",
            f"; rank {rank}: {mine.error} (una consecuencia: el rank {first.rank} se detuvo antes)",
        )
    if mine.kind == "timeout":
        return waited(mine, others, name)
    return described(mine, name)


def stub_message(launch: Launch, name: str, rank: int) -> str | None:
    """The stub's task line when this rank, or another rank of the scenario, raised NotImplementedError."""
    ranks = [rank] + [r for r in range(len(launch.results)) if r != rank]
    for r in ranks:
        result = launch.results[r].get(name) if r < len(launch.results) else None
        if result is not None and not result["ok"]:
            kind, _, message = result["error"].partition(": ")
            if kind == "NotImplementedError":
                return message
    return None


def scenario(launch: Launch, name: str, rank: int) -> dict:
    """One rank's result of one scenario; a scenario that raised fails the test with its error (a
    stub's NotImplementedError keeps its "Exercise 1.x" message); a rank that crashed or ran out of
    time before it reported fails the test with the rank's own last error. When another rank's own
    error is what stopped this one, that error comes first, this rank's as its consequence."""
    result = launch.results[rank].get(name) if rank < len(launch.results) else None
    if result is not None and result["ok"]:
        return result
    connect = next((m for e in launch.errors if (m := re.search(r"could not connect to [^\n]*", e or ""))), None)
    if result is None and connect:  # a busy machine, not the code under test: not graded, no point lost
        pytest.skip(f"{NOT_GRADED}: rank {rank}: {connect.group(0)}")
    stub = stub_message(launch, name, rank)
    if stub is not None:
        raise NotImplementedError(stub)
    own = [o for o in (outcome(launch, name, r) for r in range(len(launch.results))) if o.kind == "cause"]
    own = [o for o in own if o.state == "raised" or stopped_in(launch, o.rank) == name]
    earlier = None if own else earlier_cause(launch, name)
    if earlier is not None:  # charged once, in its own test: this one could not run
        where, cause = earlier
        pytest.skip(
            f"{NOT_GRADED}: "
            + say(
                f"it ran after {where!r}, where {described(cause, where)}; fix that one first",
                f"corrió después de {where!r}, donde {described(cause, where)}; arregla primero ese",
            )
        )
    raise AssertionError(diagnose(launch, name, rank))
