"""One rank of a pretend process group, inside the test process: for the page tests that ask the
installed PyTorch how it would lay out a mesh or shard a model, without starting any process.

PyTorch's ``fake`` backend (``torch.testing._internal.distributed.fake_pg``) accepts every call and
sends nothing: ``init_device_mesh``, ``fully_shard``'s set-up and the tensor-parallel layers' set-up
run as they would on rank ``rank`` of ``world_size`` ranks. Nothing it returns from a collective is a
real number, so these tests only read structure (groups, classes, shapes), never values.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest


@contextmanager
def fake_world(rank: int, world_size: int) -> Iterator[None]:
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        pytest.fail("a process group is already initialized in the test process; a fake world needs none")
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world_size)
    try:
        yield
    finally:
        dist.destroy_process_group()
