"""The suite's second lane: the long runs that are one process waiting for another (the grader's runs,
the notebooks' kernels), started in the background as soon as the tests are collected.

Most of the suite's time is processes started and waited for, and much of the waiting leaves a core
idle: a grading run is a pytest process whose ranks often wait on each other or on a timeout, a
notebook's kernel computes on one thread. So ``conftest.py`` starts them on this lane (two threads)
when the tests that read them are selected, and moves those tests to the end of the session: by the
time they run, most of their results are ready, and they only read them. Each run has its own
environment and folder (``tests.grading.grade_in(env)``, a kernel's own ``env``), so nothing is shared
between threads but the futures.

A fixture asks for a run by name (:meth:`Lane.submit`): started now if collection did not start it,
the same future every time.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest

KEY = pytest.StashKey["Lane"]()
# the fixtures whose results come from this lane: their tests run last (conftest.py)
# session launches that run on this lane too, by fixture: the function that submits each (conftest.py
# submits them in this order, after the gradings and the notebooks)
LAUNCHES = {
    "lab03_variants": "tests.test_lab03_run:submit",
    "lab03_practice": "tests.test_lab03_practice:submit",
    "lab03_drill": "tests.test_checkpoints:submit_drill",
    "kernel_set_runs": "tests.test_kernel_sets:submit",
    "ring_check": "tests.test_lab05_scripts:submit",
    "fsdp_mistake_check": "tests.test_lab04_reference:submit_mistake",
    "lab07_check": "tests.test_lab07_script:submit",
    "lab07_pp_check": "tests.test_lab07_script:submit_pipeline",
    "mesh_check": "tests.test_lab06_mesh_script:submit",
}
FIXTURES = {"reference_graded", "stubs_graded", "graded", "executed", *LAUNCHES}
LOG_VARIABLE = "MINIGPT_LANE_LOG"  # a file: each run's start and end, seconds from the lane's start (JSON)


class Lane:
    def __init__(self) -> None:
        self.pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="lane")
        self.futures: dict[str, Future] = {}
        self.root = Path(tempfile.mkdtemp(prefix="minigpt-lane-"))
        self.lock = threading.Lock()
        self.started = time.monotonic()
        from tests import launcher

        launcher.start_fork_server()
        self.environ = dict(os.environ)  # before any test changes it (launcher.environ)
        self.timeline: dict[str, list[float]] = {}  # run -> [start, end], seconds from the lane's start

    def submit(self, name: str, fn: Callable[[Path], object]) -> Future:
        """The run ``name``: ``fn(folder)`` on the lane, started once, with a fresh folder of its own."""
        with self.lock:
            if name not in self.futures:
                folder = self.root / re.sub(r"[^A-Za-z0-9_.-]+", "-", name)
                folder.mkdir(parents=True)
                self.futures[name] = self.pool.submit(self._timed, name, fn, folder)
            return self.futures[name]

    def _timed(self, name: str, fn: Callable[[Path], object], folder: Path) -> object:
        from tests import launcher

        launcher.LANE.environ = self.environ
        self.timeline[name] = [round(time.monotonic() - self.started, 1)]
        try:
            return fn(folder)
        finally:
            self.timeline[name].append(round(time.monotonic() - self.started, 1))

    def close(self) -> None:
        for future in self.futures.values():
            future.cancel()
        self.pool.shutdown(wait=True)
        shutil.rmtree(self.root, ignore_errors=True)
        if os.environ.get(LOG_VARIABLE):
            Path(os.environ[LOG_VARIABLE]).write_text(json.dumps(self.timeline, indent=1))


def lane(config: pytest.Config) -> Lane:
    if KEY not in config.stash:
        config.stash[KEY] = Lane()
    return config.stash[KEY]


def launch(config: pytest.Config, fixture: str, name: str, fn: Callable[[Path], object]) -> Future:
    """A session launch for ``fixture``: on the lane when ``LAUNCHES`` lists it (started at collection),
    otherwise run here and now (a finished future), in a folder of its own."""
    if fixture in LAUNCHES:
        return lane(config).submit(name, fn)
    future: Future = Future()
    folder = Path(tempfile.mkdtemp(prefix="minigpt-launch-"))
    try:
        future.set_result(fn(folder))
    except BaseException as exc:  # noqa: BLE001 - the fixture's .result() raises it
        future.set_exception(exc)
    return future


def close(config: pytest.Config) -> None:
    if KEY in config.stash:
        config.stash[KEY].close()
