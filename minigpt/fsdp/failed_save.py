"""A collective save after one rank failed: the hang, and the timeout that ends it.

``dcp.save`` is collective: every rank of the process group must call it, since the ranks agree
on one plan (which rank writes what) and rank 0 writes the ``.metadata`` index only after every
rank wrote its file. If one rank raises before it reaches the save (its disk is full, a bug in
its own code) and carries on, or stays alive in a ``try`` that swallowed the error, the other
ranks are already inside the save, waiting for a message from it that never comes. Without a
timeout they wait forever.

Every process group of the course has a timeout (:func:`minigpt.parallel.launch.init`). Here the
save runs in a group of its own with a short one, so that the demonstration costs seconds and
leaves the lab's group untouched (as the risky scenarios of ``tests/dist_worker.py`` do): rank
``failing_rank`` raises before the save; every other rank enters the save and, when the timeout
passes, gets gloo's error, which it turns into the one line the course's runs end with
(:func:`minigpt.parallel.launch.collective_failure_line`, what ``fail_collective`` prints). Then
the ranks meet in the lab's group and say what each did.
"""

from __future__ import annotations

import datetime
import tempfile
import time

import torch
import torch.distributed as dist

from minigpt.parallel import launch
from minigpt.parallel.launch import DistContext


class SimulatedFailure(RuntimeError):
    """What the failing rank raises before it reaches the save."""


def failed_save(ctx: DistContext, timeout_s: float = 5.0, failing_rank: int = 1) -> dict:
    """Every rank but ``failing_rank`` calls ``dcp.save`` on a group with a ``timeout_s`` timeout;
    ``failing_rank`` raises first. Returns, for every rank, what happened, the one line it would end
    with, and the seconds from entering the save to the error."""
    import torch.distributed.checkpoint as dcp

    if not 0 <= failing_rank < ctx.world_size:
        raise ValueError(f"failing_rank {failing_rank}: not a rank of a world of {ctx.world_size}")
    group = dist.new_group(list(range(ctx.world_size)), timeout=datetime.timedelta(seconds=timeout_s))
    mine: dict = {"rank": ctx.rank}
    with tempfile.TemporaryDirectory(prefix="minigpt-failed-save-") as folder:
        t0 = time.perf_counter()
        try:
            if ctx.rank == failing_rank:
                raise SimulatedFailure(f"rank {ctx.rank}: simulated failure before dcp.save")
            dcp.save({"weight": torch.ones(4)}, checkpoint_id=folder, process_group=group)
            mine["what"] = "saved"
        except SimulatedFailure as exc:
            mine.update(what="raised before the save", error=str(exc))
        except BaseException as exc:  # noqa: BLE001 - DCP's CheckpointException is a BaseException
            mine["seconds"] = time.perf_counter() - t0
            line, failed = launch.collective_failure_line(ctx, exc, timeout_s)
            mine.update(what="timed out in the save", line=line, failed_peers=failed)
    everyone: list[dict | None] = [None] * ctx.world_size
    dist.all_gather_object(everyone, mine)  # the lab's group, untouched by the failed one
    return {"timeout_s": timeout_s, "failing_rank": failing_rank, "ranks": everyone}
