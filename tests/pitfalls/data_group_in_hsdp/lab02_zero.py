"""A Lab 02 mistake graded on its own (tests/test_grader.py): HSDP's shard group named "data", the name of a
group that spans every device. The bytes come out right (only the replica group is across), the groups do
not say which devices talk. Everything else is the reference."""

from __future__ import annotations

from dataclasses import replace

from minigpt.parallel.zero1 import ZeroOneOptimizer, trainable_parameters  # noqa: F401
from minigpt.zero.comm import step_collectives as _reference
from minigpt.zero.memory import device_memory  # noqa: F401
from minigpt.zero.simulate import zero2_step  # noqa: F401


def step_collectives(psi, stage, shard_degree, replicas=1, recipe_name="mixed", reshard_after_forward=True):
    # Mistake: the shard group keeps the name "data" even when there are replicas.
    found = _reference(psi, stage, shard_degree, replicas, recipe_name, reshard_after_forward)
    return [replace(c, group="data") if c.group == "shard" else c for c in found]
