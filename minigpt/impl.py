"""The one place that picks which implementation runs: the reference or the learner's.

The reference lives in ``minigpt/``. The learner's version of the same functions lives in
``lab/exercises/``, as stubs with the same signatures. Everything that should run "the learner's
code when asked" (the graded tests, the lab scripts) gets its functions from :func:`load`:

    >>> causal_mask = load("lab00_baseline", "causal_mask")

Which one comes back is set by the environment variable ``MINIGPT_IMPL`` (``reference`` by
default, or ``exercises``); ``pytest --impl=exercises`` and the lab scripts' ``--impl exercises``
set it. ``MINIGPT_EXERCISES_DIR`` points at another folder of exercise files (an instructor
grading a learner's copy: ``MINIGPT_EXERCISES_DIR=~/alice/exercises make grade``). Nothing else
in ``minigpt`` imports from ``lab/``.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from functools import cache
from pathlib import Path
from types import ModuleType

IMPLS = ("reference", "exercises")
ENV_VAR = "MINIGPT_IMPL"
DIR_ENV_VAR = "MINIGPT_EXERCISES_DIR"
EXERCISES_DIR = Path(__file__).resolve().parent.parent / "lab" / "exercises"

# exercise module (a file in lab/exercises/) -> {name: "reference module:attribute"}
REFERENCE: dict[str, dict[str, str]] = {
    "lab00_baseline": {
        "causal_mask": "minigpt.model:causal_mask",
        "masked_loss": "minigpt.model:masked_loss",
        "rank_slice": "minigpt.grammar:rank_slice",
        "lr_at": "minigpt.train:lr_at",
    },
    "lab01_ddp": {
        "ring_all_reduce": "minigpt.parallel.ring:ring_all_reduce",
        "assign_buckets": "minigpt.parallel.ddp:assign_buckets",
        "BucketedDDP": "minigpt.parallel.ddp:BucketedDDP",
    },
    "lab02_zero": {
        "device_memory": "minigpt.zero.memory:device_memory",
        "zero2_step": "minigpt.zero.simulate:zero2_step",
        "step_collectives": "minigpt.zero.comm:step_collectives",
        "trainable_parameters": "minigpt.parallel.zero1:trainable_parameters",
        "ZeroOneOptimizer": "minigpt.parallel.zero1:ZeroOneOptimizer",
    },
    "lab03_fsdp": {
        "predict_event_order": "minigpt.fsdp.variants:predict_event_order",
        "local_norm_term": "minigpt.fsdp.sharded_state:local_norm_term",
        "global_grad_norm_from_shards": "minigpt.fsdp.sharded_state:global_grad_norm_from_shards",
        "units_of_policy": "minigpt.fsdp.practice:units_of_policy",
    },
}


def current() -> str:
    """The implementation selected by ``MINIGPT_IMPL`` (ValueError if it names no valid one)."""
    impl = os.environ.get(ENV_VAR, "reference") or "reference"
    if impl not in IMPLS:
        raise ValueError(f"{ENV_VAR}={impl!r} is not valid; choose one of {', '.join(IMPLS)}")
    return impl


def exercises_dir() -> Path:
    """``lab/exercises/``, or the folder named by ``MINIGPT_EXERCISES_DIR``."""
    return Path(os.environ.get(DIR_ENV_VAR) or EXERCISES_DIR).expanduser().resolve()


def exercise_module(module: str) -> ModuleType:
    """Import ``<exercises dir>/<module>.py`` by its path (``lab/`` is not an installed package)."""
    return _import_file(exercises_dir() / f"{module}.py")


@cache
def _import_file(path: Path) -> ModuleType:
    if not path.is_file():
        raise FileNotFoundError(f"no exercise file {path}")
    spec = importlib.util.spec_from_file_location(f"minigpt_exercises.{path.stem}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def reference(module: str, name: str):
    """The reference implementation of exercise ``module``'s ``name``."""
    try:
        target = REFERENCE[module][name]
    except KeyError:
        known = ", ".join(f"{m}.{n}" for m, names in REFERENCE.items() for n in names)
        raise KeyError(f"no exercise {module}.{name}; known: {known}") from None
    mod_name, attr = target.split(":")
    return getattr(importlib.import_module(mod_name), attr)


def load(module: str, name: str, impl: str | None = None):
    """``name`` from exercise ``module``: the reference or the learner's, per ``impl``
    (default: :func:`current`)."""
    impl = impl or current()
    ref = reference(module, name)  # also checks that the name is a known exercise
    if impl == "reference":
        return ref
    return getattr(exercise_module(module), name)
