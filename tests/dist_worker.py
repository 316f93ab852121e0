"""One rank of the Lab 01 test launch: ``python tests/dist_worker.py OUTDIR`` under RANK/WORLD_SIZE
(started by tests/launcher.py, normally with 4 ranks).

It runs the multi-process scenarios of tests/test_lab01.py that ``MINIGPT_SCENARIOS`` asks for
(tests/ranks.py: an exercise, "all", "maintainer"; every one when unset) in one process start
(importing torch is the slow part), with the implementation ``MINIGPT_IMPL`` selects and only the
scenario's exercise the learner's (``MINIGPT_EXERCISE``), and writes
``OUTDIR/rank<r>.json`` after every scenario: ``{scenario: {"ok": bool, "error": str, ...}}``.
Scenarios that could leave the ranks out of step (a mistake in launch order, an unused parameter)
run last, each in its own process group with a short timeout, so a learner's bug costs only the
tests that look at it and never hangs the suite.
"""

from __future__ import annotations

import datetime
import hashlib
import inspect
import json
import os
import sys
import time
from functools import partial
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from minigpt import impl
from minigpt.parallel import ring as ring_ref
from tests import launcher
from tests.limits import limit
from tests.watch import BufferWrites

OUT = Path(sys.argv[1]) if __name__ == "__main__" else None  # tests import Toy from here
RANK, WORLD = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
RESULTS: dict[str, dict] = {}
LENGTHS = (1, 3, 7, 12, 1000, 1001)  # shorter than, equal to, and not multiples of the world size


def record(name: str, fn) -> None:
    launcher.record(RESULTS, OUT, RANK, name, fn)


def digest(t: torch.Tensor) -> str:
    return hashlib.sha1(t.detach().contiguous().numpy().tobytes()).hexdigest()


def group_of(size: int, timeout_s: float = 20.0):
    return dist.new_group(list(range(size)), timeout=datetime.timedelta(seconds=limit(timeout_s)))


# ----------------------------------------------------------------------------------------------
# Exercise 1.1: the ring, for world sizes 1..4 (subgroups of the 4 ranks)


def ring_cases(group, size: int) -> dict:
    ring_all_reduce = impl.load("lab01_ddp", "ring_all_reduce")
    cases = []
    for length in LENGTHS:
        for op in ("sum", "avg"):
            gen = torch.Generator().manual_seed(1000 * RANK + length)
            values = torch.randn(length, generator=gen)
            integers = torch.randint(-50, 50, (length,), generator=gen).float()
            expected = values.clone()
            dist.all_reduce(expected, group=group)
            expected_int = integers.clone()
            dist.all_reduce(expected_int, group=group)
            if op == "avg":
                expected /= size
                expected_int /= size
            counter = ring_ref.ByteCounter()
            got = values.clone()
            returned = ring_all_reduce(got, op, group, counter)
            got_int = integers.clone()
            ring_all_reduce(got_int, op, group, ring_ref.ByteCounter())
            chunks = ring_ref.chunk_bounds(length, size)
            me = dist.get_rank(group)
            not_sent = (chunks[me][1] - chunks[me][0]) + (chunks[(me + 1) % size][1] - chunks[(me + 1) % size][0])
            cases.append(
                {
                    "length": length,
                    "op": op,
                    "returned_input": returned is got,
                    "max_error": float((got - expected).abs().max()),
                    "integer_exact": bool(torch.equal(got_int, expected_int)),
                    "digest": digest(got),
                    "bytes_sent": counter.sent,
                    "bytes_expected": 0 if size == 1 else (2 * length - not_sent) * 4,
                    "bytes_formula": 2 * (size - 1) / size * length * 4,
                }
            )
    return {"cases": cases}


def ring_rejects_bad_op(group) -> dict:
    ring_all_reduce = impl.load("lab01_ddp", "ring_all_reduce")
    try:
        ring_all_reduce(torch.ones(4), "max", group)
    except ValueError as exc:
        return {"raised": True, "message": str(exc)}
    return {"raised": False}


def reference_scatter_gather(group, size: int) -> dict:
    """The reference's reduce-scatter and all-gather on their own (not an exercise)."""
    cases = []
    me = dist.get_rank(group)
    for length in LENGTHS:
        values = torch.randn(length, generator=torch.Generator().manual_seed(7 * RANK + length))
        total = values.clone()
        dist.all_reduce(total, group=group)
        start, stop = ring_ref.chunk_bounds(length, size)[me]
        rs_counter, ag_counter = ring_ref.ByteCounter(), ring_ref.ByteCounter()
        chunk = ring_ref.ring_reduce_scatter(values.clone(), "sum", group, rs_counter)
        gathered = torch.full((length,), float("nan"))
        gathered[start:stop] = total[start:stop]
        ring_ref.ring_all_gather(gathered, group, ag_counter)
        own = stop - start
        right = ring_ref.chunk_bounds(length, size)[(me + 1) % size]
        cases.append(
            {
                "length": length,
                "rs_error": float((chunk - total[start:stop]).abs().max()) if own else 0.0,
                "ag_equal": bool(torch.equal(gathered, total)),
                "rs_bytes": rs_counter.sent,
                "rs_expected": (length - own) * 4,
                "ag_bytes": ag_counter.sent,
                "ag_expected": (length - (right[1] - right[0])) * 4,
            }
        )
    return {"cases": cases}


# ----------------------------------------------------------------------------------------------
# Exercises 1.2-1.4: the DDP, on ranks 0 and 1


class Toy(nn.Module):
    """Tied weights (embed = head), a frozen layer, and enough layers for three buckets."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(10, 8)
        self.frozen = nn.Linear(8, 8)
        self.frozen.requires_grad_(False)
        self.hidden = nn.Linear(8, 8)
        self.out = nn.Linear(8, 8)
        self.head = nn.Linear(8, 10, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, idx):
        h = self.embed(idx)
        h = torch.tanh(self.hidden(self.frozen(h)))
        return self.head(torch.tanh(self.out(h))).logsumexp(-1).mean()


def toy_batch(rank: int) -> torch.Tensor:
    return torch.randint(0, 10, (4, 5), generator=torch.Generator().manual_seed(100 + rank))


def expected_grads(model: nn.Module, world: int) -> dict[str, torch.Tensor]:
    """The average over ranks of each rank's local gradient, all computed here."""
    total = {}
    for r in range(world):
        model.zero_grad(set_to_none=True)
        model(toy_batch(r)).backward()
        for name, p in model.named_parameters():
            if p.grad is not None:
                total[name] = total.get(name, 0) + p.grad / world
    model.zero_grad(set_to_none=True)
    return total


def grad_error(model: nn.Module, expected: dict) -> float:
    worst = 0.0
    for name, p in model.named_parameters():
        if p.requires_grad:
            worst = max(worst, float((p.grad - expected[name]).abs().max()) if p.grad is not None else float("inf"))
    return worst


class _WatchedWork:
    """An all-reduce's handle whose ``wait()`` is noted when it comes before ``_launch`` returned."""

    def __init__(self, work, launch: dict):
        self._work, self._launch = work, launch

    def wait(self, *args, **kwargs):
        if self._launch.get("running"):
            self._launch["waited"] = True
        return self._work.wait(*args, **kwargs)

    def __getattr__(self, name: str):
        return getattr(self._work, name)


def watch_launches(ddp) -> list[dict]:
    """Each ``_launch`` of ``ddp``, as it happens: the calls that copied gradients into the bucket's
    buffer, the ``async_op`` of every ``dist.all_reduce`` it started, whether one of them was waited
    for before ``_launch`` returned, and whether ``bucket.handle`` was set."""
    launches: list[dict] = []
    launch, all_reduce = ddp._launch, dist.all_reduce
    signature = inspect.signature(all_reduce)

    def watched(bucket) -> None:
        seen = {"bucket": bucket.index, "params": len(bucket.params), "all_reduces": [], "waited": False}
        seen["running"] = True

        def started(*args, **kwargs):
            seen["all_reduces"].append(bool(signature.bind(*args, **kwargs).arguments.get("async_op", False)))
            work = all_reduce(*args, **kwargs)
            return None if work is None else _WatchedWork(work, seen)

        writes = BufferWrites(bucket.buffer)
        dist.all_reduce = started
        try:
            with writes:
                launch(bucket)
        finally:
            dist.all_reduce = all_reduce
            del seen["running"]
        seen["copies"], seen["handle"] = writes.count, bucket.handle is not None
        launches.append(seen)

    ddp._launch = watched
    return launches


def ddp_toy(group, collective: str = "torch") -> dict:
    BucketedDDP = impl.load("lab01_ddp", "BucketedDDP")
    torch.manual_seed(0)
    reference_copy = Toy()
    expected = expected_grads(reference_copy, 2)
    torch.manual_seed(RANK)  # different on each rank: the constructor must broadcast rank 0's
    model = Toy()
    ddp = BucketedDDP(model, bucket_cap_mb=200 / 2**20, process_group=group, collective=collective)
    same_start = all(torch.equal(p, q) for p, q in zip(model.parameters(), reference_copy.parameters()))
    launches = watch_launches(ddp) if collective == "torch" else None
    loss = ddp(toy_batch(RANK))
    loss.backward()
    grads_digest = digest(torch.cat([p.grad.flatten() for p in model.parameters() if p.requires_grad]))
    out = {
        "same_start_as_rank0": same_start,
        "grad_error": grad_error(model, expected),
        "frozen_grad_is_none": model.frozen.weight.grad is None,
        "layout": [b["params"] for b in ddp.bucket_layout()],
        "timeline": ddp.last_timeline(),
        "bytes_all_reduced": ddp.bytes_all_reduced,
        "grads_digest": grads_digest,
        "module_is_model": ddp.module is model,
        "launches": None if launches is None else list(launches),  # this backward's (a second one follows)
        "steps_synchronised": ddp.steps_synchronised,
        # each trainable .grad a view of its bucket's buffer (gradient_as_bucket_view): no copy back
        "grads_not_in_buckets": [
            n
            for n, p in model.named_parameters()
            if p.requires_grad
            and (
                p.grad is None
                or p.grad.untyped_storage().data_ptr()
                not in {b.buffer.untyped_storage().data_ptr() for b in ddp.buckets}
            )
        ],
    }
    if collective == "ring":
        out["ring_bytes_sent"] = ddp.ring_bytes.sent
    before = [p.grad.clone() for p in model.parameters() if p.requires_grad]
    ddp.finish_gradient_synchronization()  # a second call: harmless
    ddp.finish_gradient_synchronization()
    out["finish_twice_harmless"] = all(
        torch.equal(a, p.grad) for a, p in zip(before, [p for p in model.parameters() if p.requires_grad])
    )
    out["steps_after_finish_twice"] = ddp.steps_synchronised
    # a second synchronised backward starts afresh: its first hook resets the buckets and the next
    # bucket to launch, so the average comes out again (an error here is reported, not raised)
    model.zero_grad(set_to_none=True)
    try:
        ddp(toy_batch(RANK)).backward()
        out["second_backward_error"], out["second_backward_raised"] = grad_error(model, expected), ""
    except Exception as e:  # noqa: BLE001 - what the learner's hook did, for the test to show
        out["second_backward_error"], out["second_backward_raised"] = float("inf"), f"{type(e).__name__}: {e}"[:200]
    return out


def ddp_no_sync(group) -> dict:
    BucketedDDP = impl.load("lab01_ddp", "BucketedDDP")
    torch.manual_seed(0)
    reference_copy = Toy()
    expected = expected_grads(reference_copy, 2)
    reference_copy(toy_batch(RANK)).backward()
    local = {n: p.grad.clone() for n, p in reference_copy.named_parameters() if p.grad is not None}
    model = Toy()
    model.load_state_dict(reference_copy.state_dict())
    ddp = BucketedDDP(model, bucket_cap_mb=200 / 2**20, process_group=group)
    with ddp.no_sync():
        ddp(toy_batch(RANK)).backward()
    stayed_local = grad_error(model, local)
    # accumulate a second micro-batch (the same one) with sync on: the average of 2x the local grads
    ddp(toy_batch(RANK)).backward()
    accumulated = grad_error(model, {n: 2 * g for n, g in expected.items()})
    # the forward decides: forward inside no_sync, backward outside -> still no sync
    model.zero_grad(set_to_none=True)
    with ddp.no_sync():
        loss = ddp(toy_batch(RANK))
    loss.backward()
    forward_decides = grad_error(model, local)
    return {"stayed_local": stayed_local, "accumulated_error": accumulated, "forward_decides": forward_decides}


def ddp_minigpt(group) -> dict:
    """All of Lab 01 at once (the learner's DDP on the learner's ring): the gradients of one
    backward, then three AdamW steps of a small MiniGPT, two ranks against one process on the
    global batch."""
    from minigpt import grammar
    from minigpt.parallel import equivalence
    from minigpt.train import TrainConfig, build_model, build_optimizer, train_step

    BucketedDDP = impl.load("lab01_ddp", "BucketedDDP")
    cfg = TrainConfig(steps=3, batch_size=16, n_layer=2, n_head=2, n_embd=32, warmup=1, lr=1e-3)
    baseline = build_model(cfg)
    base_opt = build_optimizer(baseline, cfg)
    model = build_model(cfg)
    ddp = BucketedDDP(model, bucket_cap_mb=0.05, process_group=group, collective="ring")
    opt = build_optimizer(model, cfg)
    # the gradients first: AdamW divides by the gradient's own size, so a gradient twice too
    # large (summed, not averaged) moves the weights almost as the right one would
    batch = partial(grammar.get_batch, "train", 0, cfg.batch_size, seed=cfg.seed, block_size=cfg.block_size)
    ddp(*batch(RANK, 2))[1].backward()
    baseline(*batch(0, 1))[1].backward()
    grad_error = max(float((p.grad - q.grad).abs().max()) for p, q in zip(model.parameters(), baseline.parameters()))
    model.zero_grad(set_to_none=True)
    baseline.zero_grad(set_to_none=True)
    probe = equivalence.Probe(build_model(cfg), rows=8)  # logits computed exactly (float64)
    drifts, digests = [], []
    for step in range(cfg.steps):
        train_step(baseline, base_opt, step, cfg)
        train_step(ddp, opt, step, cfg, rank=RANK, world_size=2)
        drifts.append(probe.drift(baseline, model))
        digests.append(digest(torch.cat([p.flatten() for p in model.parameters()])))
    return {"drifts": drifts, "digests": digests, "buckets": len(ddp.buckets), "grad_error": grad_error}


def ddp_bucket_order(group) -> dict:
    """The gradients of ``a`` and ``b`` become ready in opposite orders on the two ranks."""
    BucketedDDP = impl.load("lab01_ddp", "BucketedDDP")

    class TwoParams(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Parameter(torch.full((3,), 1.0 + RANK))
            self.b = nn.Parameter(torch.full((5,), 2.0 + RANK))

        def forward(self, x):
            if RANK == 0:  # b is nearer the loss: its gradient comes first
                return (self.b.sum() * (self.a * x).sum()).sum()
            return (self.a.sum() * (self.b * x).sum()).sum()

    model = TwoParams()
    ddp = BucketedDDP(model, bucket_cap_mb=1e-6, process_group=group)  # one parameter per bucket
    ddp(torch.tensor(2.0)).backward()
    # rank 0's parameters everywhere: a = 1, b = 2. d/da = 2*sum(b) = 20 on rank 0;
    # rank 1: d/da = 2*sum(b) = 20 too; d/db = 2*sum(a) = 6 on both. Averages are the same.
    return {"a_grad": model.a.grad.tolist(), "b_grad": model.b.grad.tolist()}


def ddp_unused(group) -> dict:
    BucketedDDP = impl.load("lab01_ddp", "BucketedDDP")

    class Unused(nn.Module):
        def __init__(self):
            super().__init__()
            self.used = nn.Linear(4, 4)
            self.forgotten = nn.Linear(4, 4)

        def forward(self, x):
            return self.used(x).sum()

    torch.manual_seed(0)
    ddp = BucketedDDP(Unused(), bucket_cap_mb=1e-6, process_group=group)
    start = time.perf_counter()
    try:
        ddp(torch.ones(2, 4)).backward()
    except NotImplementedError:  # a RuntimeError too: the stub's own message is the reason
        raise
    except RuntimeError as exc:
        return {"raised": True, "message": str(exc), "seconds": time.perf_counter() - start}
    return {"raised": False, "seconds": time.perf_counter() - start}


class Mixed(nn.Module):
    """A float32 layer and a float64 one: one bucket cannot hold both."""

    def __init__(self):
        super().__init__()
        self.first, self.second = nn.Linear(8, 8), nn.Linear(8, 8).double()

    def forward(self, x):
        return self.second(torch.tanh(self.first(x)).double())


def models_it_was_not_built_for() -> dict[str, nn.Module]:
    """Shapes MiniGPT does not have: tied weights and a frozen layer (Toy), an MLP stack whose
    weights are larger than the cap, many small layers, and a float64 layer beside float32 ones."""
    torch.manual_seed(0)
    return {
        "toy": Toy(),
        "mlp": nn.Sequential(nn.Linear(16, 64), nn.GELU(), nn.Linear(64, 16), nn.GELU(), nn.Linear(16, 4)),
        "many-small": nn.Sequential(*[nn.Sequential(nn.LayerNorm(6), nn.Linear(6, 6)) for _ in range(12)]),
        "mixed-dtypes": Mixed(),
    }


def model_loss(name: str, model: nn.Module, step: int, rank: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 * step + rank)
    if name == "toy":
        return model(torch.randint(0, 10, (4, 5), generator=g))
    width = {"mlp": 16, "many-small": 6, "mixed-dtypes": 8}[name]
    return model(torch.randn(4, width, generator=g)).square().mean()


def ddp_against_torch(group, size: int) -> dict:
    """The reference BucketedDDP and PyTorch's DDP on the same models, data and caps, 3 SGD steps
    (momentum): their parameters must agree on every world size. Not graded: it checks the
    course's DDP, whatever implementation is selected."""
    from minigpt.parallel.ddp import BucketedDDP

    out = {}
    for name in models_it_was_not_built_for():
        for cap_bytes in (100, 4000):
            models = [models_it_was_not_built_for()[name] for _ in range(2)]
            wrapped = [
                BucketedDDP(models[0], bucket_cap_mb=cap_bytes / 2**20, process_group=group),
                nn.parallel.DistributedDataParallel(models[1], bucket_cap_mb=cap_bytes / 2**20, process_group=group),
            ]
            optimizers = [
                torch.optim.SGD([p for p in m.parameters() if p.requires_grad], lr=0.1, momentum=0.9) for m in models
            ]
            for step in range(3):
                for w, opt in zip(wrapped, optimizers):
                    model_loss(name, w, step, dist.get_rank(group)).backward()
                    opt.step()
                    opt.zero_grad(set_to_none=True)
            diffs = [float((a.double() - b.double()).abs().max()) for a, b in zip(*(m.parameters() for m in models))]
            out[f"{name}@{cap_bytes}"] = {"max_diff": max(diffs), "buckets": len(wrapped[0].buckets)}
    return out


def ddp_versions(group) -> dict:
    """The DDP versions Lab 01's benchmark compares (minigpt/parallel/ddp_steps.py): each must compute
    the same gradients as the reference, bit for bit (2 ranks)."""
    from minigpt.parallel.ddp_steps import VERSIONS

    grads = {}
    for version, cls in VERSIONS.items():
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(16, 64), nn.GELU(), nn.Linear(64, 16))
        ddp = cls(model, bucket_cap_mb=1000 / 2**20, process_group=group)
        for step in range(2):  # the second step finds .grad already in the buckets (views)
            for p in model.parameters():
                p.grad = None if step == 0 else p.grad.zero_()
            ddp(
                torch.randn(4, 16, generator=torch.Generator().manual_seed(step + 10 * RANK))
            ).square().mean().backward()
        grads[version] = digest(torch.cat([p.grad.flatten() for p in model.parameters()]))
    return {"digests": grads}


def peers_answering() -> dict:
    """How a survivor finds which ranks on other machines still answer (minigpt.parallel.launch):
    every rank but the last says "alive" through the rendezvous store; the last stays silent."""
    from minigpt.parallel import launch

    if RANK == WORLD - 1:
        return {"alive": None}
    ctx = launch.DistContext(RANK, RANK, WORLD, "gloo", torch.device("cpu"), limit(30))
    alive = launch.peers_answering(ctx, wait_s=limit(3))
    return {"alive": None if alive is None else sorted(alive)}


def main() -> None:
    launcher.join(limit(30))
    torch.set_num_threads(1)
    wanted = set(filter(None, os.environ.get("MINIGPT_SCENARIOS", "").split(","))) or None  # None: all

    def run(name: str, tag: str, fn) -> None:
        """Scenario ``name`` for the tests of exercise ``tag`` (only that exercise the learner's)."""
        if wanted is not None and tag not in wanted:
            return
        os.environ[impl.ONLY_ENV_VAR] = "all" if tag == "maintainer" else tag
        record(name, fn)

    groups = {size: group_of(size) for size in range(1, WORLD + 1)}
    for size, group in groups.items():
        if RANK < size:
            run(f"ring_{size}", "1.1", partial(ring_cases, group, size))
            run(f"ring_reference_{size}", "maintainer", partial(reference_scatter_gather, group, size))
    if RANK < 2:
        pair = groups[2]
        run("ring_bad_op", "1.1", lambda: ring_rejects_bad_op(pair))
        for exercise in ("1.3", "1.4"):
            run(f"ddp_toy@{exercise}", exercise, lambda: ddp_toy(pair))
        run("ddp_ring@1.3", "1.3", lambda: ddp_toy(pair, collective="ring"))
        run("ddp_no_sync@1.3", "1.3", lambda: ddp_no_sync(pair))
        run("ddp_minigpt@all", "all", lambda: ddp_minigpt(pair))
        run("ddp_versions", "maintainer", lambda: ddp_versions(pair))
    for size, group in groups.items():
        if 2 <= size and RANK < size:
            run(f"ddp_against_torch_{size}", "maintainer", partial(ddp_against_torch, group, size))
    if WORLD == 4:
        run("peers_answering", "maintainer", peers_answering)
    # the scenarios that can leave ranks out of step: own groups, short timeouts, last
    risky = [group_of(2, timeout_s=8.0) for _ in range(2)]
    if RANK < 2:
        run("ddp_unused@1.4", "1.4", lambda: ddp_unused(risky[0]))
        run("ddp_bucket_order@1.3", "1.3", lambda: ddp_bucket_order(risky[1]))
    (OUT / f"rank{RANK}.json").write_text(json.dumps({**RESULTS, "finished": {"ok": True}}))
    os._exit(0)  # no polite tear-down: a peer stuck in a broken group must not hold us


if __name__ == "__main__":
    main()
