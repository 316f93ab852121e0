"""Start-up and tear-down of a distributed run, from the environment ``torchrun`` sets.

``torchrun --nproc_per_node=2 script.py`` starts two copies of ``script.py`` and gives each one
``RANK`` (its number among all processes), ``LOCAL_RANK`` (its number on this machine),
``WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT`` (where the rendezvous store lives). A script
started with plain ``python`` has none of them and runs as a world of one.

:func:`init` picks the backend (gloo on CPU, NCCL when the process has a GPU), sets the timeout
every collective obeys, and returns a :class:`DistContext`. :func:`log` prefixes every line with
the rank. :func:`fail` ends a rank with a message that names it, so a failure on one machine is
never a silent hang on another.
"""

from __future__ import annotations

import datetime
import gc
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from minigpt import cli

DEFAULT_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class DistContext:
    rank: int
    local_rank: int
    world_size: int
    backend: str
    device: torch.device
    timeout_s: float

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def torchrun_env() -> tuple[int, int, int]:
    """``(rank, local_rank, world_size)`` from torchrun's environment, or ``(0, 0, 1)`` for a
    plain ``python`` start. A half-set environment, a rank that is not below the world size, a
    port that is not one...: :class:`minigpt.cli.BadInput` (a ValueError) naming the variable and
    its value (:func:`minigpt.cli.launcher_env`), before any process group exists."""
    return cli.launcher_env()


def init(timeout_s: float = DEFAULT_TIMEOUT_S, backend: str | None = None) -> DistContext:
    """Join the process group torchrun described (a world of one without torchrun).

    ``backend`` defaults to ``"nccl"`` when CUDA is available and ``"gloo"`` otherwise; with
    NCCL each process takes the GPU of its ``LOCAL_RANK``. ``timeout_s`` bounds every collective:
    a peer that died or hangs ends this rank with an error instead of a wait without end.
    """
    if timeout_s <= 0:
        raise ValueError(f"the collective timeout must be positive, got {timeout_s} s")
    rank, local_rank, world_size = torchrun_env()
    if backend is None:
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend not in ("gloo", "nccl"):
        raise ValueError(f"backend {backend!r} is not supported; use gloo or nccl")
    if backend == "nccl":
        if not torch.cuda.is_available():
            raise RuntimeError("backend nccl needs a GPU and this process sees none; use gloo")
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    if world_size > 1 or "RANK" in os.environ:
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29500")
        dist.init_process_group(
            backend,
            rank=rank,
            world_size=world_size,
            timeout=datetime.timedelta(seconds=timeout_s),
            **({"device_id": device} if backend == "nccl" else {}),
        )
    else:  # plain python: a world of one over a private store, so collectives still work
        store = dist.HashStore()
        dist.init_process_group(
            backend, store=store, rank=0, world_size=1, timeout=datetime.timedelta(seconds=timeout_s)
        )
    return DistContext(rank, local_rank, world_size, backend, device, timeout_s)


def log(ctx: DistContext | None, message: str, all_ranks: bool = False) -> None:
    """Print ``[rank r] message`` (only rank 0 unless ``all_ranks``)."""
    rank = 0 if ctx is None else ctx.rank
    if all_ranks or rank == 0:
        print(f"[rank {rank}] {message}", flush=True)


def fail(ctx: DistContext | None, message: str, code: int = 1) -> None:
    """End this rank with ``[rank r] error: message`` on stderr and exit code ``code``.

    The process group is not torn down politely (a peer may be gone, and a polite tear-down
    would wait for it); the process exits at once and its peers see the connection close.
    """
    rank = "?" if ctx is None else ctx.rank
    print(f"[rank {rank}] error: {message}", file=sys.stderr, flush=True)
    sys.stdout.flush()
    os._exit(code)


def fail_collective(ctx: DistContext | None, exc: BaseException, timeout_s: float) -> None:
    """End this rank after a collective failed: name the error and its likely cause (a peer that
    died or stopped answering), so that every surviving rank stops with a message, never a hang."""
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    fail(
        ctx,
        f"{type(exc).__name__}: {first}\n  a peer rank probably died or stopped answering "
        f"(collective timeout {timeout_s:g} s); the other ranks stop too",
        code=1,
    )


def write_report(path: str | Path, report: dict, indent: int = 2) -> None:
    """Write a run's JSON report atomically (a temporary file, then a rename): an interrupted run
    leaves the previous report or none, never half of one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(report, indent=indent) + "\n")
    os.replace(tmp, path)


def teardown() -> None:
    """Leave the process group. Garbage is collected first: wrapped modules (FSDP's hooks make
    reference cycles) can keep gloo work objects and their tensors alive, and if those are
    destroyed only during interpreter shutdown, gloo's threads abort the process ("terminate
    called without an active exception": Lab 03's practice script lost rank 1 so in 2 of 12 runs
    without this collection, in 0 of 30 with it)."""
    if dist.is_initialized():
        gc.collect()
        dist.destroy_process_group()
