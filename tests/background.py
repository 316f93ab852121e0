"""The suite's second lane: the long runs that are one process waiting for another (the grader's runs,
the notebooks' kernels), started in the background as soon as the tests are collected.

Most of the suite's time is processes started and waited for, and much of the waiting leaves a core
idle: a grading run is a pytest process whose ranks often wait on each other or on a timeout, a
notebook's kernel computes on one thread. So ``conftest.py`` starts them on this lane (two threads)
when the tests that read them are selected, and moves those tests to the end of the session: by the
time they run, most of their results are ready, and they only read them. Each run has its own
environment and folder (``grader.grade(env=...)``, a kernel's own ``env``), so nothing is shared
between threads but the futures.

A fixture asks for a run by name (:meth:`Lane.submit`): started now if collection did not start it,
the same future every time.
"""

from __future__ import annotations

import re
import shutil
import tempfile
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest

KEY = pytest.StashKey["Lane"]()
# the fixtures whose results come from this lane: their tests run last (conftest.py)
FIXTURES = {"reference_graded", "stubs_graded", "graded", "executed"}


class Lane:
    def __init__(self) -> None:
        self.pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="lane")
        self.futures: dict[str, Future] = {}
        self.root = Path(tempfile.mkdtemp(prefix="minigpt-lane-"))
        self.lock = threading.Lock()

    def submit(self, name: str, fn: Callable[[Path], object]) -> Future:
        """The run ``name``: ``fn(folder)`` on the lane, started once, with a fresh folder of its own."""
        with self.lock:
            if name not in self.futures:
                folder = self.root / re.sub(r"[^A-Za-z0-9_.-]+", "-", name)
                folder.mkdir(parents=True)
                self.futures[name] = self.pool.submit(fn, folder)
            return self.futures[name]

    def close(self) -> None:
        for future in self.futures.values():
            future.cancel()
        self.pool.shutdown(wait=True)
        shutil.rmtree(self.root, ignore_errors=True)


def lane(config: pytest.Config) -> Lane:
    if KEY not in config.stash:
        config.stash[KEY] = Lane()
    return config.stash[KEY]


def close(config: pytest.Config) -> None:
    if KEY in config.stash:
        config.stash[KEY].close()
