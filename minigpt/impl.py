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

One exercise at a time: with ``MINIGPT_EXERCISE=1.3`` (the grader sets it for each graded test),
only exercise 1.3 is the learner's and the reference stands in for every other one. The learner's
file is imported afresh, and each name of another exercise is put back to the reference in that
copy: a module-level function is replaced (so the learner's ``_launch`` that calls
``ring_all_reduce`` calls the reference ring), and a method the learner wrote in a class built on
the reference's scaffolding is removed from the class (so the scaffolding's, which is the
reference, answers). So exercise 1.3 earns its points before 1.4 is written, and a lost point
names the exercise the test is for, not the first stub on the call path.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import os
from functools import cache
from pathlib import Path
from types import ModuleType

IMPLS = ("reference", "exercises")
ENV_VAR = "MINIGPT_IMPL"
DIR_ENV_VAR = "MINIGPT_EXERCISES_DIR"
ONLY_ENV_VAR = "MINIGPT_EXERCISE"
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
    "lab04_fsdp": {
        "shard_rows": "minigpt.parallel.fsdp_by_hand.sharding:shard_rows",
        "gather_rows": "minigpt.parallel.fsdp_by_hand.sharding:gather_rows",
        "unit_parameters": "minigpt.parallel.fsdp_by_hand.ownership:unit_parameters",
        "reduce_gradients": "minigpt.parallel.fsdp_by_hand.gradients:reduce_gradients",
        "global_grad_norm": "minigpt.parallel.fsdp_by_hand.gradients:global_grad_norm",
        "backward_prefetch_targets": "minigpt.parallel.fsdp_by_hand.prefetch:backward_prefetch_targets",
        "FSDPUnit": "minigpt.parallel.fsdp_by_hand.unit:FSDPUnit",
    },
    "lab05_tensor_parallel": {
        "column_slice": "minigpt.parallel.tensor_parallel.layers:column_slice",
        "row_slice": "minigpt.parallel.tensor_parallel.layers:row_slice",
        "row_parallel_linear": "minigpt.parallel.tensor_parallel.layers:row_parallel_linear",
        "copy_to_tp": "minigpt.parallel.tensor_parallel.comm:copy_to_tp",
        "reduce_from_tp": "minigpt.parallel.tensor_parallel.comm:reduce_from_tp",
        "vocab_parallel_cross_entropy": "minigpt.parallel.tensor_parallel.layers:vocab_parallel_cross_entropy",
        "online_softmax_step": "minigpt.parallel.tensor_parallel.ring_attention:online_softmax_step",
        "block_mask": "minigpt.parallel.tensor_parallel.ring_attention:block_mask",
    },
    "lab06_pipeline": {
        "one_f_one_b": "minigpt.parallel.pipeline.schedule:one_f_one_b",
        "forward_step": "minigpt.parallel.pipeline.engine:forward_step",
        "backward_step": "minigpt.parallel.pipeline.engine:backward_step",
    },
    "lab06_mesh": {
        "resolve_hsdp": "minigpt.parallel.mesh.degrees:resolve_hsdp",
        "hsdp_bytes_per_dim": "minigpt.parallel.mesh.hsdp:hsdp_bytes_per_dim",
    },
    "lab07_nd_parallel": {
        "mesh_groups": "minigpt.parallel.mesh.nd:mesh_groups",
        "batch_plan": "minigpt.parallel.mesh.nd:batch_plan",
        "whole_parameter": "minigpt.parallel.mesh.compose:whole_parameter",
    },
}


# exercise -> (exercise module, the names it covers; "Class.method" for a method of a class the
# learner builds on the reference's scaffolding). "P1.1", ...: a prediction (minigpt/predictions.py), a
# number in lab/exercises/predictions.py that no other exercise's code reads.
EXERCISES: dict[str, tuple[str, tuple[str, ...]]] = {
    "0.1": ("lab00_baseline", ("causal_mask",)),
    "0.2": ("lab00_baseline", ("masked_loss",)),
    "0.3": ("lab00_baseline", ("rank_slice",)),
    "0.4": ("lab00_baseline", ("lr_at",)),
    "1.1": ("lab01_ddp", ("ring_all_reduce",)),
    "1.2": ("lab01_ddp", ("assign_buckets", "BucketedDDP.assign_buckets")),
    "1.3": ("lab01_ddp", ("BucketedDDP._on_grad_ready", "BucketedDDP._launch")),
    "1.4": ("lab01_ddp", ("BucketedDDP.finish_gradient_synchronization",)),
    "P1.1": ("predictions", ()),
    "P1.2": ("predictions", ()),
    "2.1": ("lab02_zero", ("device_memory",)),
    "2.2": ("lab02_zero", ("zero2_step",)),
    "2.3": ("lab02_zero", ("step_collectives",)),
    "2.4": ("lab02_zero", ("trainable_parameters", "ZeroOneOptimizer.trainable_parameters")),
    "2.5": ("lab02_zero", ("ZeroOneOptimizer.step",)),
    "P2.1": ("predictions", ()),
    "P2.2": ("predictions", ()),
    "3.1": ("lab03_fsdp", ("predict_event_order",)),
    "3.2": ("lab03_fsdp", ("local_norm_term", "global_grad_norm_from_shards")),
    "3.3": ("lab03_fsdp", ("units_of_policy",)),
    "P3.1": ("predictions", ()),
    "P3.2": ("predictions", ()),
    "4.1": ("lab04_fsdp", ("shard_rows", "gather_rows", "FSDPUnit.shard_rows", "FSDPUnit.gather_rows")),
    "4.2": ("lab04_fsdp", ("unit_parameters", "FSDPUnit.unit_parameters")),
    "4.3": (
        "lab04_fsdp",
        ("FSDPUnit.before_forward", "FSDPUnit.after_forward", "FSDPUnit.before_backward", "FSDPUnit.after_backward"),
    ),
    "4.4": (
        "lab04_fsdp",
        ("reduce_gradients", "global_grad_norm", "FSDPUnit.reduce_scatter_gradients", "FSDPUnit.global_grad_norm"),
    ),
    "4.5": ("lab04_fsdp", ("backward_prefetch_targets", "FSDPUnit.backward_prefetch_targets")),
    "P4.1": ("predictions", ()),
    "P4.2": ("predictions", ()),
    "5.1": ("lab05_tensor_parallel", ("column_slice", "row_slice", "row_parallel_linear")),
    "5.2": ("lab05_tensor_parallel", ("copy_to_tp", "reduce_from_tp")),
    "5.3": ("lab05_tensor_parallel", ("vocab_parallel_cross_entropy",)),
    "5.4": ("lab05_tensor_parallel", ("online_softmax_step", "block_mask")),
    "P5.1": ("predictions", ()),
    "P5.2": ("predictions", ()),
    "6.1": ("lab06_pipeline", ("one_f_one_b",)),
    "6.2": ("lab06_pipeline", ("forward_step", "backward_step")),
    "6.3": ("lab06_mesh", ("resolve_hsdp",)),
    "6.4": ("lab06_mesh", ("hsdp_bytes_per_dim",)),
    "P6.1": ("predictions", ()),
    "P6.2": ("predictions", ()),
    "7.1": ("lab07_nd_parallel", ("mesh_groups",)),
    "7.2": ("lab07_nd_parallel", ("batch_plan",)),
    "7.3": ("lab07_nd_parallel", ("whole_parameter",)),
    "P7.1": ("predictions", ()),
    "P7.2": ("predictions", ()),
}


def lab_of(exercise: str) -> str:
    """The lab of an exercise or a prediction: "4.3" and "P4.1" are Lab "04"."""
    return f"{int(exercise.removeprefix('P').split('.')[0]):02d}"


def current() -> str:
    """The implementation selected by ``MINIGPT_IMPL`` (ValueError if it names no valid one)."""
    impl = os.environ.get(ENV_VAR, "reference") or "reference"
    if impl not in IMPLS:
        raise ValueError(f"{ENV_VAR}={impl!r} is not valid; choose one of {', '.join(IMPLS)}")
    return impl


def exercises_dir() -> Path:
    """``lab/exercises/``, or the folder named by ``MINIGPT_EXERCISES_DIR``."""
    return Path(os.environ.get(DIR_ENV_VAR) or EXERCISES_DIR).expanduser().resolve()


def only_exercise() -> str | None:
    """The one exercise that is the learner's (``MINIGPT_EXERCISE``), or None: all of them are.
    ValueError if it names no exercise."""
    only = os.environ.get(ONLY_ENV_VAR, "").strip()
    if not only or only == "all":
        return None
    if only not in EXERCISES:
        raise ValueError(f"{ONLY_ENV_VAR}={only!r} is not an exercise; choose one of {', '.join(EXERCISES)} or all")
    return only


def exercise_module(module: str) -> ModuleType:
    """Import ``<exercises dir>/<module>.py`` by its path (``lab/`` is not an installed package),
    with the reference standing in for every exercise but :func:`only_exercise`."""
    return _import_file(exercises_dir() / f"{module}.py", only_exercise())


def _import_file(path: Path, only: str | None = None) -> ModuleType:
    """The module in ``path``, imported once per version of the file: an edit (a new modification
    time or size) is imported again at the next call, so a notebook's next "your turn" cell runs
    what the learner just saved, without restarting the kernel."""
    if not path.is_file():
        raise FileNotFoundError(f"no exercise file {path}")
    stat = path.stat()
    return _import_version(path, only, stat.st_mtime_ns, stat.st_size)


@cache
def _import_version(path: Path, only: str | None, mtime_ns: int, size: int) -> ModuleType:  # noqa: ARG001 (the cache key)
    suffix = "" if only is None else "_only_" + only.replace(".", "_")
    spec = importlib.util.spec_from_file_location(f"minigpt_exercises.{path.stem}{suffix}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    if only is not None:
        _stand_in(mod, path.stem, only)
    return mod


def _stand_in(mod: ModuleType, module: str, only: str) -> None:
    """Put the reference back for every name of ``module`` that belongs to another exercise."""
    for exercise, (owner, names) in EXERCISES.items():
        if owner != module or exercise == only:
            continue
        for name in names:
            if "." not in name:
                setattr(mod, name, reference(module, name))
                continue
            cls_name, method = name.split(".")
            cls = getattr(mod, cls_name)
            if method in vars(cls):
                scaffold = reference(module, cls_name)
                if issubclass(cls, scaffold):
                    delattr(cls, method)  # the scaffolding's method is the reference's
                else:
                    setattr(cls, method, vars(scaffold)[method])


def reference(module: str, name: str):
    """The reference implementation of exercise ``module``'s ``name``."""
    try:
        target = REFERENCE[module][name]
    except KeyError:
        known = ", ".join(f"{m}.{n}" for m, names in REFERENCE.items() for n in names)
        raise KeyError(f"no exercise {module}.{name}; known: {known}") from None
    mod_name, attr = target.split(":")
    return getattr(importlib.import_module(mod_name), attr)


def untouched(exercise: str) -> str | None:
    """The message of the stub that ``exercise`` still is in the learner's file (the first of its names
    whose body is only the ``raise NotImplementedError("Exercise N.M: ...")`` it came with, and that
    nothing assigns again further down), or None once any of it is written. Read from the file, not
    run: a notebook asks before it starts ranks that would only stop there."""
    module, names = EXERCISES[exercise]
    path = exercises_dir() / f"{module}.py"
    if not names or not path.is_file():
        return None
    tree = ast.parse(path.read_text(encoding="utf-8"))
    assigned = {ast.unparse(t) for n in tree.body if isinstance(n, ast.Assign) for t in n.targets}
    for name in names:
        if name in assigned:  # ``name = ...`` or ``Class.method = ...`` after the stub: written
            continue
        *owner, leaf = name.split(".")
        scope = tree.body
        for cls in owner:
            scope = next((n.body for n in scope if isinstance(n, ast.ClassDef) and n.name == cls), [])
        found = [n for n in scope if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == leaf]
        body = found[-1].body if found else []
        if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
            body = body[1:]  # the docstring
        if len(body) == 1 and isinstance(body[0], ast.Raise) and isinstance(body[0].exc, ast.Call):
            call = body[0].exc
            named = isinstance(call.func, ast.Name) and call.func.id == "NotImplementedError"
            if named and call.args and isinstance(call.args[0], ast.Constant) and isinstance(call.args[0].value, str):
                return call.args[0].value
    return None


def load(module: str, name: str, impl: str | None = None):
    """``name`` from exercise ``module``: the reference or the learner's, per ``impl``
    (default: :func:`current`)."""
    impl = impl or current()
    ref = reference(module, name)  # also checks that the name is a known exercise
    if impl == "reference":
        return ref
    return getattr(exercise_module(module), name)
