"""One rank of the Lab 06 test launch: ``python tests/pipeline_worker.py OUTDIR`` under
RANK/WORLD_SIZE (started by tests/launcher.py through the ``pipeline_scratch`` fixture, 3 ranks:
three stages, so one of them sits in the middle and both receives and sends each way).

It runs the multi-process scenarios of tests/test_lab06.py and tests/test_lab06_reference.py that
``MINIGPT_SCENARIOS`` asks for (an exercise, "all", or "maintainer"; every one when unset), each
with only its exercise the learner's (``MINIGPT_EXERCISE``), and writes ``OUTDIR/rank<r>.json``
after every scenario. Every scenario gets its own process group with a short timeout, created up
front in the same order on every rank: the pipeline's sends and receives (``Link``) and the tied
matrix's swap go through it (the worker points the modules' ``dist`` at that group; the mechanism
itself talks to the default group), so a learner's step that never sends costs only the tests
that read that scenario, and a gloo timeout (which closes the group's connections) breaks nothing
else. The deadlock scenario runs last all the same.

Everything is float64, and every rank builds the same MiniGPT (3 blocks, one per stage) and the
same batch from the same seeds, so each rank computes the one-process gradients itself and
compares its own stage's.
"""

from __future__ import annotations

import datetime
import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from minigpt import impl
from minigpt.model import GPTConfig, MiniGPT
from minigpt.parallel.pipeline import engine, link as link_module
from minigpt.parallel.pipeline.engine import MicroBatches, run_schedule, step_bytes_model, sync_tied_gradient
from minigpt.parallel.pipeline.link import Link
from minigpt.parallel.pipeline.schedule import check_schedule, gpipe, one_f_one_b, peak_held, schedule_orders
from minigpt.parallel.pipeline.stage import PipelineStage
from tests import launcher
from tests.limits import limit

OUT = Path(sys.argv[1]) if __name__ == "__main__" else None
RANK, WORLD = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
RESULTS: dict[str, dict] = {}
CONFIG = GPTConfig(block_size=12, n_layer=3, n_head=2, n_embd=16)
BATCH, SEQ = 4, 12
# a graded scenario's receives (scaled by MINIGPT_TIME_SCALE); tests/test_grader.py shortens it for the
# pitfall whose every scenario waits for a gradient that never comes (five waits of 10 s otherwise)
STEP_TIMEOUT_S = float(os.environ.get("MINIGPT_PIPELINE_STEP_TIMEOUT_S", "10"))
DEADLOCK_TIMEOUT_S = 2.0  # the middle stage's, in the deadlock scenario (the others wait longer)


def record(name: str, fn) -> None:
    launcher.record(RESULTS, OUT, RANK, name, fn)


def learners(name: str):
    return impl.load("lab06_pipeline", name)


class OnGroup:
    """``torch.distributed`` with the point-to-point calls sent through ``group``."""

    def __init__(self, group):
        self.group = group

    def isend(self, tensor, dst, tag=0):
        return dist.isend(tensor, dst=dst, tag=tag, group=self.group)

    def recv(self, tensor, src, tag=0):
        return dist.recv(tensor, src=src, tag=tag, group=self.group)

    def __getattr__(self, name):
        return getattr(dist, name)


def on_group(group, fn):
    """Run ``fn()`` with the pipeline's sends and receives on ``group``."""

    def run():
        link_module.dist = engine.dist = OnGroup(group)
        try:
            return fn()
        finally:
            link_module.dist = engine.dist = dist

    return run


def model_and_batch() -> tuple[MiniGPT, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The same MiniGPT (float64, norms and biases moved off their init) and batch on every rank."""
    torch.manual_seed(0)
    model = MiniGPT(CONFIG).double()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias") or ".ln_" in name or name.startswith("ln_f"):
                p.add_(0.1 * torch.randn_like(p))
    g = torch.Generator().manual_seed(6)
    x = torch.randint(0, CONFIG.vocab_size, (BATCH, SEQ), generator=g)
    y = torch.randint(0, CONFIG.vocab_size, (BATCH, SEQ), generator=g)
    mask = torch.rand(BATCH, SEQ, generator=g) < 0.6
    mask[:, -1] = True  # every sentence counts at least one token
    return model, x, y, mask


def one_step(schedule, m: int, forward, backward, timeout_s: float) -> dict:
    """One forward and backward of the pipeline (``schedule``'s lists, checked first; ``forward``
    and ``backward`` run each operation), the tied gradient swapped, against one process."""
    model, x, y, mask = model_and_batch()
    _, loss = model(x, y, mask)
    loss.backward()
    grads = {n: p.grad for n, p in model.named_parameters()}
    grads["lm_head.weight"] = grads["wte.weight"]
    orders = schedule_orders(schedule, WORLD, m)
    check_schedule(orders, m)  # a deadlocking set of lists: ValueError on every rank, nothing sent
    stage = PipelineStage(model, RANK, WORLD)
    stage.zero_grad(set_to_none=True)
    link = Link(RANK, list(range(WORLD)), (BATCH // m, SEQ, CONFIG.n_embd), torch.float64, timeout_s)
    rec = run_schedule(stage, orders[RANK], MicroBatches.cut(x, y, mask, m), link, forward, backward)
    sync_tied_gradient(stage, 0, WORLD - 1, link.counter)
    missing = [n for n, p in stage.named_in_model() if p.grad is None]
    diffs = {n: float((p.grad - grads[n]).abs().max()) for n, p in stage.named_in_model() if p.grad is not None}
    worst = max(diffs, key=diffs.get) if diffs else None
    return {
        "missing": missing,
        "grad_diff": diffs[worst] if worst else None,
        "worst": worst,
        "loss_diff": abs(float(rec.loss) - loss.item()) if stage.is_last else 0.0,
        "bytes": link.counter.sent,
        "bytes_model": step_bytes_model(WORLD, RANK, BATCH, SEQ, CONFIG.n_embd, CONFIG.vocab_size, 8),
        "peak": rec.peak_held,
        "peak_expected": peak_held(orders[RANK]),
    }


def releasing(backward, kept: list[int]):
    """The learner's backward_step, watched: a ``B i`` that returns with micro-batch i still in
    ``held`` (read, not taken out) is written down in ``kept``, and i is released here, so that the
    step still ends and its gradients and bytes are still checked (the peak is then the schedule's)."""

    def step(stage, i, link, held):
        backward(stage, i, link, held)
        if i in held:
            kept.append(i)
            held.pop(i)

    return step


def learners_steps(schedule, m: int) -> dict:
    kept: list[int] = []
    backward = releasing(learners("backward_step"), kept)
    return {**one_step(schedule, m, learners("forward_step"), backward, limit(STEP_TIMEOUT_S)), "kept": kept}


def learners_all(m: int) -> dict:
    kept: list[int] = []
    backward = releasing(learners("backward_step"), kept)
    return {
        **one_step(learners("one_f_one_b"), m, learners("forward_step"), backward, limit(STEP_TIMEOUT_S)),
        "kept": kept,
    }


def reversed_warmup(stage: int, stages: int, micro_batches: int) -> list[tuple[str, int]]:
    """1F1B with the warm-up counted from the wrong end (``stage`` forwards instead of
    ``stages - 1 - stage``): the last stage waits for a forward the first one never starts."""
    return one_f_one_b(stages - 1 - stage, stages, micro_batches)


def deadlock(timeout_s: float) -> dict:
    """Lists that block each other, run with check_schedule bypassed: each stage stops in a receive
    until its timeout (the middle stage's is the shortest), and says who waited for what."""
    m = 2
    model, x, y, mask = model_and_batch()
    orders = schedule_orders(reversed_warmup, WORLD, m)
    stage = PipelineStage(model, RANK, WORLD)
    link = Link(RANK, list(range(WORLD)), (BATCH // m, SEQ, CONFIG.n_embd), torch.float64, timeout_s)
    run_schedule(stage, orders[RANK], MicroBatches.cut(x, y, mask, m), link)
    return {"finished": True}


def main() -> None:
    # the default group only lines the ranks up before each scenario: a rank stuck in a scenario's
    # receive until that group's timeout is waited for here, so the next scenario starts together
    launcher.join(limit(60))
    torch.set_num_threads(1)
    wanted = set(filter(None, os.environ.get("MINIGPT_SCENARIOS", "").split(","))) or None

    def group(timeout_s: float):
        return dist.new_group(list(range(WORLD)), timeout=datetime.timedelta(seconds=timeout_s))

    names = ["gpipe", "1f1b", "1f1b-m2", "all", "all-m2"]
    groups = {name: group(limit(STEP_TIMEOUT_S)) for name in names}
    # the middle stage gives up first, so its PipelineTimeout is the one the test reads; its
    # neighbours see the connection close at once (or give up later on their own)
    deadlock_s = DEADLOCK_TIMEOUT_S if RANK == 1 else limit(3 * DEADLOCK_TIMEOUT_S)
    groups["deadlock"] = group(deadlock_s)

    def run(name: str, tag: str, fn) -> None:
        if wanted is not None and tag not in wanted:
            return
        os.environ[impl.ONLY_ENV_VAR] = tag
        dist.barrier()
        record(f"{name}@{tag}", on_group(groups[name], fn))

    run("gpipe", "6.2", lambda: learners_steps(gpipe, 4))
    run("1f1b", "6.2", lambda: learners_steps(one_f_one_b, 4))
    run("1f1b-m2", "6.2", lambda: learners_steps(one_f_one_b, 2))
    run("all", "all", lambda: learners_all(4))
    run("all-m2", "all", lambda: learners_all(2))
    run("deadlock", "maintainer", lambda: deadlock(deadlock_s))  # last: a timeout closes pairs
    (OUT / f"rank{RANK}.json").write_text(json.dumps({**RESULTS, "finished": {"ok": True}}))
    os._exit(0)  # no polite tear-down: a peer stuck in a broken group must not hold us


if __name__ == "__main__":
    main()
