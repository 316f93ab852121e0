"""The grading harness.

* ``--impl=reference|exercises`` picks whose code the graded tests run (default: reference, or
  the ``MINIGPT_IMPL`` environment variable). It is exported as ``MINIGPT_IMPL`` so that lab
  scripts started by a test run the same implementation.
* A graded test carries ``@pytest.mark.points(n)``; its lab comes from ``@pytest.mark.lab("00")``
  (usually set once per file with ``pytestmark``). Tests without points check the course's own
  machinery and are not scored.
* At the end of every run a score table is printed, one line per lab, e.g.
  ``Lab 00 · MiniGPT and the baseline · 12/12``, followed by a short reason for each lost point.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass, field

import pytest

from minigpt import impl as impl_switch
from tests import limits
from tests.limits import limit

LAB_TITLES = {
    "00": "MiniGPT and the baseline",
    "01": "DDP from scratch",
    "02": "ZeRO simulator",
    "03": "FSDP prefetch",
}


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--impl",
        choices=impl_switch.IMPLS,
        default=os.environ.get(impl_switch.ENV_VAR) or "reference",
        help="whose implementation the graded tests run: the reference in minigpt/ "
        "or yours in lab/exercises/ (default: reference)",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Scale every test's time limit (its ``timeout`` marker, or the ini's) by MINIGPT_TIME_SCALE."""
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
    config.addinivalue_line("markers", "points(n): a graded test worth n points")
    config.addinivalue_line("markers", "lab(id): the lab a graded test belongs to, e.g. '00'")
    config.stash[_SCORES] = {}
    config.stash[_SKIPPED] = []


@dataclass
class _Result:
    lab: str
    points: int
    name: str
    passed: bool = True
    reason: str = ""
    seen: set = field(default_factory=set)


_SCORES = pytest.StashKey[dict]()
_SKIPPED = pytest.StashKey[list]()  # (test id, reason) of every test that did not run


def _points_and_lab(item: pytest.Item) -> tuple[int, str] | None:
    points = item.get_closest_marker("points")
    if points is None:
        return None
    lab = item.get_closest_marker("lab")
    if lab is None:
        raise pytest.UsageError(f"{item.nodeid} has points but no @pytest.mark.lab")
    return int(points.args[0]), str(lab.args[0])


def _ran_out_of_time(call: pytest.CallInfo) -> bool:
    """Did a time limit end this test (pytest-timeout's, a subprocess's, or tests/launcher's)?"""
    exc = call.excinfo
    if exc is None:
        return False
    text = exc.exconly()
    return exc.errisinstance(subprocess.TimeoutExpired) or "Timeout (>" in text or "killed at its time limit" in text


def _reason(call: pytest.CallInfo) -> str:
    exc = call.excinfo
    if exc is None:
        return ""
    if exc.errisinstance(NotImplementedError):
        return str(exc.value) or "not implemented"
    if _ran_out_of_time(call):
        return f"ran out of time, it did not fail: {exc.exconly().strip().splitlines()[0][:120]} ({limits.HINT})"
    text = exc.exconly().strip().splitlines()
    first = text[0] if text else exc.typename
    return first if len(first) <= 200 else first[:197] + "..."


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
    result = scores.setdefault(item.nodeid, _Result(graded[1], graded[0], item.name))
    result.seen.add(report.when)
    if report.failed or report.skipped:
        if result.passed:  # keep the first reason
            result.reason = "skipped" if report.skipped else _reason(call)
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


@pytest.fixture
def lab00(impl_name: str) -> _Exercises:
    """Lab 00's functions (causal_mask, masked_loss, rank_slice, lr_at) under test."""
    return _Exercises("lab00_baseline", impl_name)


@pytest.fixture
def lab02(impl_name: str) -> _Exercises:
    """Lab 02's functions (device_memory, zero2_step, step_collectives) under test."""
    return _Exercises("lab02_zero", impl_name)


@pytest.fixture
def lab03(impl_name: str) -> _Exercises:
    """Lab 03's functions (predict_event_order, local_norm_term, global_grad_norm_from_shards,
    units_of_policy) under test."""
    return _Exercises("lab03_fsdp", impl_name)


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_terminal_summary(terminalreporter, exitstatus, config: pytest.Config):
    yield  # the outermost wrapper: the table comes after pytest's own summary, last on screen
    scores: dict[str, _Result] = config.stash.get(_SCORES, {})
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
        terminalreporter.write_sep("=", f"score ({impl} implementation, {where})")
        for lab in sorted({r.lab for r in scores.values()}):
            results = [r for r in scores.values() if r.lab == lab]
            # a test that never reached its call phase (setup error) has not passed
            earned = sum(r.points for r in results if r.passed and "call" in r.seen)
            total = sum(r.points for r in results)
            title = LAB_TITLES.get(lab, "")
            terminalreporter.write_line(f"Lab {lab} · {title} · {earned}/{total}")
            for r in results:
                if not (r.passed and "call" in r.seen):
                    terminalreporter.write_line(f"    lost {r.points} pt: {r.name}: {r.reason or 'did not run'}")
    # a test that did not run proves nothing: say so where the eye lands last, not only in pytest's list
    for nodeid, reason in config.stash.get(_SKIPPED, []):
        terminalreporter.write_line(f"NOT RUN: {nodeid}: {reason}", red=True, bold=True)


@pytest.fixture(scope="session")
def default_run(tmp_path_factory):
    """``python -m minigpt.train`` with every default (the README's single-process run), trained once
    per session, on one thread: two threads that spin-wait for each other on a busy two-core machine
    can take ten times as long, and the tests read only its accuracy and loss, not its last bits.
    Returns the checkpoint path, the output, and the numbers of its final line."""
    out = tmp_path_factory.mktemp("default") / "minigpt.pt"
    proc = subprocess.run(
        [sys.executable, "-m", "minigpt.train", "--quiet", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=limit(240),
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
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
